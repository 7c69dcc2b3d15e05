"""`python -m specdec.native.check`: exit 1 where the native kernels should have been built and were not.

On an x86 machine with a C compiler and a CPU with AVX2 and FMA the install must build specdec.native._linear and
specdec.native._attention from their current sources; the install itself goes on without them (they are optional, for
machines without a compiler), so CI asks here: a silently failed build would leave it without kernel coverage."""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path


def should_be_built() -> bool:
    if platform.machine() not in ("x86_64", "AMD64") or not (shutil.which("cc") or shutil.which("gcc")):
        return False
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    return {"avx2", "fma"} <= flags


def main() -> int:
    from specdec.fp32 import kernels

    if not should_be_built():
        print("specdec native kernels: not expected here (no x86 AVX2/FMA CPU or no C compiler)")
        return 0
    if not kernels.invariant_kernels_available():
        print("specdec native kernels: NOT BUILT on an x86 machine with a C compiler; see the install log "
              "(pip install -e . -v)", file=sys.stderr)
        return 1
    stale = kernels.stale_native_modules()
    if stale:
        print(f"specdec native kernels: {stale} built from other sources; reinstall (pip install -e .)",
              file=sys.stderr)
        return 1
    print(f"specdec native kernels: built ({kernels.kernel_build()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
