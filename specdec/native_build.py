"""How the native modules are built and identified: one definition for setup.py (which loads this file by path,
before torch or specdec can be imported) and for the engine (specdec.kernels.kernel_build and its staleness check).

A module's build id hashes its C source and these flags; setup.py compiles it in (SPECDEC_BUILD), so a loaded module
says which code it is, and a source edited after the build is noticed."""

import hashlib
from pathlib import Path

NATIVE_MODULES = ("_linear", "_attention", "_quant")
# -ffp-contract=off: no multiply-add is fused unless the source says so (fmaf, _mm256_fmadd_ps), so the float
# operations are the ones written, in every module and with every compiler default
COMPILE_ARGS = ["-O3", "-fopenmp", "-ffp-contract=off"]
LINK_ARGS = ["-fopenmp"]


def source_path(name: str) -> Path:
    return Path(__file__).with_name(f"{name}.c")


def build_id(name: str) -> str:
    """The build id of native module `name` as its source and flags stand now."""
    flags = " ".join(COMPILE_ARGS + LINK_ARGS).encode()
    return hashlib.sha256(source_path(name).read_bytes() + flags).hexdigest()[:12]
