"""How the native modules are built and identified: one definition for setup.py (which loads this file by path,
before torch or specdec can be imported) and for the engine (specdec.kernels.kernel_build and its staleness check).

A module's build id hashes its C source and these flags; setup.py compiles it in (SPECDEC_BUILD), so a loaded module
says which code it is, and a source edited after the build is noticed."""

import hashlib
from pathlib import Path

NATIVE_MODULES = ("_linear", "_attention", "_quant", "_rowops")
# -ffp-contract=off: no multiply-add is fused unless the source says so (fmaf, _mm256_fmadd_ps), so the float
# operations are the ones written, in every module and with every compiler default
COMPILE_ARGS = ["-O3", "-fopenmp", "-ffp-contract=off"]
LINK_ARGS = ["-fopenmp"]


def source_path(name: str) -> Path:
    return Path(__file__).with_name(f"{name}.c")


def headers() -> list[Path]:
    """The headers every native module includes (specdec/_simd.h)."""
    return sorted(Path(__file__).parent.glob("_*.h"))


def build_id(name: str) -> str:
    """The build id of native module `name` as its source, the shared headers and the flags stand now."""
    flags = " ".join(COMPILE_ARGS + LINK_ARGS).encode()
    sources = b"".join(path.read_bytes() for path in [source_path(name), *headers()])
    return hashlib.sha256(sources + flags).hexdigest()[:12]
