"""The compiled pieces under specdec/native/: _linear (batch-1 linear layers), _attention (batch-invariant attention
for decoding), _quant, _rowops and _layers (the GGUF engine's products and fused layers), for x86 CPUs with AVX2/FMA.

Optional: where they cannot be built (no C compiler, no OpenMP) the install goes on without them and the engine uses
torch's own kernels (specdec/fp32/kernels.py asks whether they are there; .ci/run insists on them on x86). Each module
carries SPECDEC_BUILD, a hash of its source and compile flags (specdec/native/build.py), so that tables timed on one
build are never reused for another."""

import runpy
from pathlib import Path

from setuptools import Extension, setup

native = runpy.run_path(str(Path(__file__).parent / "specdec" / "native" / "build.py"))


def extension(name: str) -> Extension:
    return Extension(f"specdec.native.{name}", [f"specdec/native/{name}.c"], extra_compile_args=native["COMPILE_ARGS"],
                     extra_link_args=native["LINK_ARGS"], depends=[str(h) for h in native["headers"]()],
                     define_macros=[("SPECDEC_BUILD", f'"{native["build_id"](name)}"')], optional=True)


setup(ext_modules=[extension(name) for name in native["NATIVE_MODULES"]])
