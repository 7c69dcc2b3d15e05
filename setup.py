"""The compiled pieces: specdec._linear (batch-1 linear layers, specdec/_linear.c) and specdec._attention (batch-
invariant attention for decoding, specdec/_attention.c), for x86 CPUs with AVX2 and FMA.

Optional: where they cannot be built (no C compiler, no OpenMP) the install goes on without them and the engine uses
torch's own kernels (specdec/kernels.py asks whether they are there; .ci/run insists on them on x86). Each module
carries SPECDEC_BUILD, a hash of its source and compile flags (specdec/native_build.py), so that tables timed on one
build are never reused for another."""

import runpy
from pathlib import Path

from setuptools import Extension, setup

native = runpy.run_path(str(Path(__file__).parent / "specdec" / "native_build.py"))


def extension(name: str) -> Extension:
    return Extension(f"specdec.{name}", [f"specdec/{name}.c"], extra_compile_args=native["COMPILE_ARGS"],
                     extra_link_args=native["LINK_ARGS"], depends=[str(h) for h in native["headers"]()],
                     define_macros=[("SPECDEC_BUILD", f'"{native["build_id"](name)}"')], optional=True)


setup(ext_modules=[extension(name) for name in native["NATIVE_MODULES"]])
