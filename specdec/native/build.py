"""How the native modules are built and identified: one definition for setup.py (which loads this file by path,
before torch or specdec can be imported) and for the engine (specdec.fp32.kernels.kernel_build and its staleness check).

A module's build id hashes its C source and these flags; setup.py compiles it in (SPECDEC_BUILD), so a loaded module
says which code it is, and a source edited after the build is noticed."""

import hashlib
import importlib
from pathlib import Path

NATIVE_MODULES = ("_linear", "_attention", "_quant", "_rowops", "_layers")
# -ffp-contract=off: no multiply-add is fused unless the source says so (fmaf, _mm256_fmadd_ps), so the float
# operations are the ones written, in every module and with every compiler default. -fno-wrapv: Python's own CFLAGS,
# which setuptools puts first, carry -fwrapv (signed overflow defined to wrap), and under it the fused layers took
# 1.1-1.3x as long at one and two positions (AMD EPYC Zen 4, experiments/cpu-lead, twelfth run); no value changes,
# since the sources never overflow a signed integer.
COMPILE_ARGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-wrapv"]
LINK_ARGS = ["-fopenmp"]


def source_path(name: str) -> Path:
    return Path(__file__).with_name(f"{name}.c")


def headers() -> list[Path]:
    """The headers every native module includes (specdec/native/_simd.h)."""
    return sorted(Path(__file__).parent.glob("_*.h"))


def build_id(name: str) -> str:
    """The build id of native module `name` as its source, the shared headers and the flags stand now."""
    flags = " ".join(COMPILE_ARGS + LINK_ARGS).encode()
    sources = b"".join(path.read_bytes() for path in [source_path(name), *headers()])
    return hashlib.sha256(sources + flags).hexdigest()[:12]


def loaded_modules() -> dict:
    """name -> the native module as this install built it, or None where it was not built (imported here, not
    through the engine's wrappers, so that the workflow can ask without importing torch)."""
    modules = {}
    for name in NATIVE_MODULES:
        try:
            modules[name] = importlib.import_module(f"specdec.native.{name}")
        except ImportError:
            modules[name] = None
    return modules


def kernel_build() -> str:
    """The native modules' build (hashes of their sources and compile flags, set by setup.py), or "none": part of
    the key of every table timed on them, so that an edited or rebuilt kernel is timed again."""
    builds = [module.build() for module in loaded_modules().values() if module is not None]
    return "-".join(builds) if builds else "none"


def stale_native_modules() -> list[str]:
    """Native modules whose source was edited after they were built (an editable install does not rebuild them):
    their timings and results would describe other code."""
    return [name for name, module in loaded_modules().items()
            if module is not None and source_path(name).is_file() and build_id(name) != module.build()]
