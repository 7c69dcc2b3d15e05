"""The integer multiply-add rate of this CPU's vector units: the ceiling a compute-bound product (a prompt pass, a
verify pass of many rows) is measured against.

    python bench/multiply_rate.py [--instructions zmm-vpdpbusd ymm-vpmaddubsw ...] [--cores 2] [--out rate.csv]

Each instruction runs on 12 independent accumulators (more than its latency times its ports need), one process
pinned to each core, every core at once (a CPU may lower its clock when all its cores run wide instructions).
Prints instructions and multiply-adds per second per core (median over cores); --out writes one row per instruction
and core (CSV, atomically). Compiles its probe with gcc; runs only the instructions this CPU has (/proc/cpuinfo
flags). Run it alone on the machine."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specdec.study.machine import cpuinfo

# name: (multiply-adds per instruction, the /proc/cpuinfo flags it needs, the instruction, its register prefix)
INSTRUCTIONS = {
    "zmm-vpdpbusd": (64, {"avx512_vnni"}, "vpdpbusd", "zmm"),
    "ymm-vpdpbusd": (32, {"avx512_vnni", "avx512vl"}, "%{evex%} vpdpbusd", "ymm"),
    "ymm-vpdpbusd-vex": (32, {"avx_vnni"}, "%{vex%} vpdpbusd", "ymm"),
    "zmm-vpmaddubsw": (64, {"avx512bw"}, "vpmaddubsw", "zmm"),
    "ymm-vpmaddubsw": (32, {"avx2"}, "vpmaddubsw", "ymm"),
    "zmm-vpmaddwd": (32, {"avx512bw"}, "vpmaddwd", "zmm"),
    "ymm-vpmaddwd": (16, {"avx2"}, "vpmaddwd", "ymm"),
    "zmm-vpmulld": (16, {"avx512f"}, "vpmulld", "zmm"),
    "ymm-vpmulld": (8, {"avx2"}, "vpmulld", "ymm"),
}
ACCUMULATORS = 12


def cpu_flags() -> set[str]:
    return set(cpuinfo()["flags"])


def runnable(flags: set[str]) -> list[str]:
    return [name for name, (_, needs, _, _) in INSTRUCTIONS.items() if needs <= flags]


def _symbol(name: str) -> str:
    return name.replace("-", "_")


def _loop(name: str) -> str:
    """A C function running `n` rounds of ACCUMULATORS independent instructions (inline assembly: the compiler
    neither spills the accumulators nor merges them) and returning the seconds taken."""
    _, _, instruction, reg = INSTRUCTIONS[name]
    body = "".join(f'"{instruction} %%{reg}14, %%{reg}15, %%{reg}{i}\\n"\n' for i in range(ACCUMULATORS))
    clobbers = ", ".join(f'"xmm{i}"' for i in list(range(ACCUMULATORS)) + [14, 15])
    return f"""
static double {_symbol(name)}(long n) {{
    double t = now();
    __asm__ volatile("vpxor %%xmm14, %%xmm14, %%xmm14\\n vpxor %%xmm15, %%xmm15, %%xmm15\\n 1:\\n"
{body}        "dec %0\\n jnz 1b\\n" : "+r"(n) :: {clobbers});
    return now() - t;
}}
"""


def probe_source(names: list[str]) -> str:
    dispatch = "".join(f'    if (!strcmp(argv[1], "{name}")) s = {_symbol(name)}(n);\n' for name in names)
    return ("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <time.h>\n"
            "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); "
            "return t.tv_sec + t.tv_nsec * 1e-9; }\n"
            + "".join(_loop(name) for name in names)
            + "int main(int argc, char **argv) {\n    long n = atol(argv[2]); double s = -1;\n" + dispatch
            + '    if (s < 0) return 2;\n    printf("%.9f\\n", s);\n    return 0;\n}\n')


def build_probe(names: list[str], where: Path) -> Path:
    if shutil.which("gcc") is None:
        sys.exit("multiply_rate: needs gcc to build its probe")
    source, binary = where / "probe.c", where / "probe"
    source.write_text(probe_source(names))
    subprocess.run(["gcc", "-O1", "-o", str(binary), str(source)], check=True)
    return binary


def rate_per_core(binary: Path, name: str, cores: list[int], rounds: int) -> list[float]:
    """Instructions per second on each core, all of them running at once (the probe prints its seconds)."""
    procs = [subprocess.Popen([str(binary), name, str(rounds)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=lambda core=core: os.sched_setaffinity(0, {core})) for core in cores]
    seconds = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"multiply_rate: the probe failed on {name} (exit {proc.returncode})")
        seconds.append(float(out))
    return [rounds * ACCUMULATORS / s for s in seconds]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instructions", nargs="+", default=None, help="default: every one this CPU has")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=50_000_000, help="rounds of 12 instructions a measurement")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.cores < 1:  # the probe's loop counts down to zero: it must start above it
        parser.error("--rounds and --cores must be at least 1")
    have = runnable(cpu_flags())
    names = args.instructions or have
    missing = [name for name in names if name not in have]
    if missing:
        parser.error(f"{missing} are not instructions this CPU runs (it runs {have}; known: {list(INSTRUCTIONS)})")
    cores = sorted(os.sched_getaffinity(0))[:args.cores]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_probe(names, Path(tmp))
        for name in names:
            rates = rate_per_core(binary, name, cores, args.rounds)
            macs = INSTRUCTIONS[name][0]
            rows += [{"instruction": name, "core": core, "per_s": rate, "macs_per_s": rate * macs}
                     for core, rate in zip(cores, rates)]
            median = statistics.median(rates)
            print(f"{name:18s} {median / 1e9:6.2f} G/s a core  {median * macs / 1e9:7.1f} G multiply-adds/s a core "
                  f"({len(cores)} cores at once)", flush=True)
    if args.out:
        import pandas as pd

        from specdec.study.io import write_csv

        write_csv(pd.DataFrame(rows), args.out)


if __name__ == "__main__":
    main()
