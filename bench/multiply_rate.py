"""The integer multiply-add rate of this CPU's vector units: the ceiling a compute-bound product (a prompt pass, a
verify pass of many rows) is measured against.

    python bench/multiply_rate.py [--instructions zmm-vpdpbusd ymm-vpmaddubsw ...] [--beside vpternlogd ...]
                                  [--cores 2] [--out rate.csv]

Each instruction runs on 12 independent accumulators (more than its latency times its ports need), one process
pinned to each core, every core at once (a CPU may lower its clock when all its cores run wide instructions).
Prints instructions and multiply-adds per second per core (median over cores); --out writes one row per instruction
and core (CSV, atomically). Compiles its probe with gcc; runs only the instructions this CPU has (/proc/cpuinfo
flags). Run it alone on the machine.

--beside also runs each instruction with one companion after each of its 12 and prints the share of a multiply's
slot each companion takes: 0 where the two issue in the same cycle, 1 where the companion waits for the multiplier
as another multiply would (the rate of a kernel that mixes them is then the count of its instructions weighted so,
over this rate: bench/verify_roofline.py). The 512-bit companions (vpandd, ...) run on registers of their own, no
dependence between them; the 256-bit ones (ymm-vpaddw, ...: AVX2 has sixteen registers) on the register the
multiply before them wrote, so only beside a multiply that reads no accumulator (ymm-vpmaddubsw, ymm-vpmaddwd)."""

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
# name: (the /proc/cpuinfo flags it needs, its form on the companion's register {j}); 512-bit, as in the group
# functions (specdec/native/_quant_groups.h)
COMPANIONS = {
    "vpandd": ({"avx512f"}, "vpandd %%zmm14, %%zmm15, %%zmm{j}"),
    "vpsrlw": ({"avx512bw"}, "vpsrlw $4, %%zmm15, %%zmm{j}"),
    "vpternlogd": ({"avx512f"}, "vpternlogd $0xf8, %%zmm14, %%zmm15, %%zmm{j}"),
    "vpshufb": ({"avx512bw"}, "vpshufb %%zmm14, %%zmm15, %%zmm{j}"),
    "vpbroadcastd-load": ({"avx512f"}, "vpbroadcastd (%1), %%zmm{j}"),
    "vcvtdq2ps": ({"avx512f"}, "vcvtdq2ps %%zmm15, %%zmm{j}"),
    "vfmadd231ps": ({"avx512f"}, "vfmadd231ps %%zmm14, %%zmm15, %%zmm{j}"),
    "vpmulld": ({"avx512f"}, "vpmulld %%zmm14, %%zmm15, %%zmm{j}"),
    "vpdpwssd": ({"avx512_vnni"}, "vpdpwssd %%zmm14, %%zmm15, %%zmm{j}"),
    "vpmaddubsw": ({"avx512bw"}, "vpmaddubsw %%zmm14, %%zmm15, %%zmm{j}"),
    "vpmaddwd": ({"avx512bw"}, "vpmaddwd %%zmm14, %%zmm15, %%zmm{j}"),
    "vmulps": ({"avx512f"}, "vmulps %%zmm14, %%zmm15, %%zmm{j}"),
    "vaddps": ({"avx512f"}, "vaddps %%zmm14, %%zmm15, %%zmm{j}"),
    "vpaddd": ({"avx512f"}, "vpaddd %%zmm14, %%zmm15, %%zmm{j}"),
    "vpsllw": ({"avx512bw"}, "vpsllw $4, %%zmm15, %%zmm{j}"),
    "vpmovsxbw": ({"avx512bw"}, "vpmovsxbw %%ymm15, %%zmm{j}"),
    "vpmovzxbd": ({"avx512f"}, "vpmovzxbd %%xmm15, %%zmm{j}"),
    "vcvtph2ps": ({"avx512f"}, "vcvtph2ps %%ymm15, %%zmm{j}"),
    "vmovdqa32": ({"avx512f"}, "vmovdqa32 %%zmm15, %%zmm{j}"),
    "vpshufb-merge": ({"avx512bw"}, "vpshufb %%zmm14, %%zmm15, %%zmm{j}%{{%%k1%}}"),  # k1: whatever it holds
    # 256-bit, as in the avx2 kernel's functions; beside a multiply that reads no accumulator only (YMM_BASES), each
    # on its multiply's own register (AVX2 has sixteen): a fresh write, or (a multiply-add) a read of the value just
    # written, so no chain runs from one round to the next
    "ymm-vpand": ({"avx2"}, "vpand %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpor": ({"avx2"}, "vpor %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpsrlw": ({"avx2"}, "vpsrlw $4, %%ymm15, %%ymm{j}"),
    "ymm-vpsllw": ({"avx2"}, "vpsllw $4, %%ymm15, %%ymm{j}"),
    "ymm-vpshufb": ({"avx2"}, "vpshufb %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpermq": ({"avx2"}, "vpermq $0x4e, %%ymm15, %%ymm{j}"),
    "ymm-vpbroadcastd-load": ({"avx2"}, "vpbroadcastd (%1), %%ymm{j}"),
    "ymm-vpaddw": ({"avx2"}, "vpaddw %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpaddd": ({"avx2"}, "vpaddd %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpmaddubsw": ({"avx2"}, "vpmaddubsw %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpmaddwd": ({"avx2"}, "vpmaddwd %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpmulld": ({"avx2"}, "vpmulld %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vpmovsxbw": ({"avx2"}, "vpmovsxbw %%xmm15, %%ymm{j}"),
    "ymm-vpmovzxbd": ({"avx2"}, "vpmovzxbd %%xmm15, %%ymm{j}"),
    "ymm-vpmovsxbw-load": ({"avx2"}, "vpmovsxbw (%1), %%ymm{j}"),  # the widening straight from memory
    "ymm-vpmovzxbd-load": ({"avx2"}, "vpmovzxbd (%1), %%ymm{j}"),
    "ymm-vcvtph2ps": ({"avx2", "f16c"}, "vcvtph2ps %%xmm15, %%ymm{j}"),
    "ymm-vcvtdq2ps": ({"avx2"}, "vcvtdq2ps %%ymm15, %%ymm{j}"),
    "ymm-vfmadd231ps": ({"avx2", "fma"}, "vfmadd231ps %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vmulps": ({"avx2"}, "vmulps %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vaddps": ({"avx2"}, "vaddps %%ymm14, %%ymm15, %%ymm{j}"),
    "ymm-vmovdqa": ({"avx2"}, "vmovdqa %%ymm15, %%ymm{j}"),
}
YMM_BASES = ("ymm-vpmaddubsw", "ymm-vpmaddwd")  # the multiplies the 256-bit companions run beside
PAIRS = 5  # alone-then-paired runs a companion's share is read from
COMPANION_BASE = 16  # the companions' registers: zmm16 .. zmm27, apart from the multiplies' zmm0 .. zmm11


def cpu_flags() -> set[str]:
    return set(cpuinfo()["flags"])


def runnable(flags: set[str]) -> list[str]:
    return [name for name, (_, needs, _, _) in INSTRUCTIONS.items() if needs <= flags]


def runnable_companions(flags: set[str]) -> list[str]:
    return [name for name, (needs, _) in COMPANIONS.items() if needs <= flags]


def _symbol(name: str) -> str:
    return name.replace("-", "_").replace("+", "__")


def _loop(name: str, beside: str | None = None) -> str:
    """A C function running `n` rounds of ACCUMULATORS independent instructions, each followed by its companion
    where `beside` names one (inline assembly: the compiler neither spills the accumulators nor merges them), and
    returning the seconds taken."""
    _, _, instruction, reg = INSTRUCTIONS[name]
    companion = COMPANIONS[beside][1] if beside else None
    base = 0 if is_256(beside) else COMPANION_BASE  # the 256-bit ones on the multiply's own register
    body = "".join(f'"{instruction} %%{reg}14, %%{reg}15, %%{reg}{i}\\n"\n'
                   + (f'"{companion.format(j=base + i)}\\n"\n' if companion else "")
                   for i in range(ACCUMULATORS))
    registers = list(range(ACCUMULATORS)) + [14, 15]
    if companion and not is_256(beside):
        registers += [COMPANION_BASE + i for i in range(ACCUMULATORS)]
    clobbers = ", ".join(f'"xmm{i}"' for i in registers)
    return f"""
static double {_symbol(pair_name(name, beside))}(long n) {{
    double t = now();
    __asm__ volatile("vpxor %%xmm14, %%xmm14, %%xmm14\\n vpxor %%xmm15, %%xmm15, %%xmm15\\n 1:\\n"
{body}        "dec %0\\n jnz 1b\\n" : "+r"(n) : "r"(scratch) : {clobbers});
    return now() - t;
}}
"""


def is_256(companion: str | None) -> bool:
    """Whether a companion is one of the 256-bit ones (on the multiply's own register)."""
    return bool(companion) and companion.startswith("ymm-")


def pair_name(name: str, beside: str | None) -> str:
    """The probe's name for an instruction alone or with a companion."""
    return f"{name}+{beside}" if beside else name


def probe_source(names: list[str], companions: list[str] = ()) -> str:
    runs = [(name, None) for name in names] + [(name, beside) for name in names for beside in companions]
    dispatch = "".join(f'    if (!strcmp(argv[1], "{pair_name(*run)}")) s = {_symbol(pair_name(*run))}(n);\n'
                       for run in runs)
    return ("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <time.h>\n"
            "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); "
            "return t.tv_sec + t.tv_nsec * 1e-9; }\n"
            "static int scratch[16]; /* what the loads among the companions read */\n"
            + "".join(_loop(*run) for run in runs)
            + "int main(int argc, char **argv) {\n    long n = atol(argv[2]); double s = -1;\n" + dispatch
            + '    if (s < 0) return 2;\n    printf("%.9f\\n", s);\n    return 0;\n}\n')


def build_probe(names: list[str], where: Path, companions: list[str] = ()) -> Path:
    if shutil.which("gcc") is None:
        sys.exit("multiply_rate: needs gcc to build its probe")
    source, binary = where / "probe.c", where / "probe"
    source.write_text(probe_source(names, companions))
    # the 512-bit companions' registers zmm16.. exist for the compiler's clobber list only with AVX-512 on
    flags = ["-mavx512f"] if any(not is_256(c) for c in companions) else []
    subprocess.run(["gcc", "-O1", *flags, "-o", str(binary), str(source)], check=True)
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


def best_of_pairs(binary: Path, alone: str, paired: str, cores: list[int], rounds: int,
                  pairs: int = PAIRS) -> tuple[list[float], list[float]]:
    """Each core's best rate of `alone` and of `paired`, run in turn `pairs` times: a neighbour on a shared host
    only ever slows a run down, so the best of each is the cleanest reading of it."""
    runs = [(rate_per_core(binary, alone, cores, rounds), rate_per_core(binary, paired, cores, rounds))
            for _ in range(pairs)]
    return ([max(run[0][c] for run in runs) for c in range(len(cores))],
            [max(run[1][c] for run in runs) for c in range(len(cores))])


def companion_share(alone: float, paired: float) -> float:
    """The share of a multiply's slot a companion takes: each round of 12 multiplies took 1 / alone alone and
    1 / paired with 12 companions beside them."""
    return alone / paired - 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instructions", nargs="+", default=None, help="default: every one this CPU has")
    parser.add_argument("--beside", nargs="+", default=[],
                        help=f"companions to run each instruction with as well (known: {list(COMPANIONS)}; the "
                             f"256-bit ones, ymm-*, beside {list(YMM_BASES)} only)")
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
    have_companions = runnable_companions(cpu_flags())
    missing = [name for name in args.beside if name not in have_companions]
    if missing:
        parser.error(f"{missing} are not companions this CPU runs (it runs {have_companions}; known: "
                     f"{list(COMPANIONS)})")
    if any(map(is_256, args.beside)) and not set(names) <= set(YMM_BASES):
        parser.error(f"the 256-bit companions run on the multiply's own register: beside {list(YMM_BASES)} only "
                     f"(asked beside {[n for n in names if n not in YMM_BASES]})")
    cores = sorted(os.sched_getaffinity(0))[:args.cores]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_probe(names, Path(tmp), args.beside)
        rate_per_core(binary, names[0], cores, args.rounds)  # a warm-up: the first run found the cores slower
        for name in names:
            rates = rate_per_core(binary, name, cores, args.rounds)
            macs = INSTRUCTIONS[name][0]
            rows += [{"instruction": name, "beside": "", "core": core, "per_s": rate, "macs_per_s": rate * macs,
                      "companion_share": float("nan")} for core, rate in zip(cores, rates)]
            median = statistics.median(rates)
            print(f"{name:18s} {median / 1e9:6.2f} G/s a core  {median * macs / 1e9:7.1f} G multiply-adds/s a core "
                  f"({len(cores)} cores at once)", flush=True)
            for beside in args.beside:
                alone, paired = best_of_pairs(binary, name, pair_name(name, beside), cores, args.rounds)
                shares = [companion_share(a, b) for a, b in zip(alone, paired)]
                rows += [{"instruction": name, "beside": beside, "core": core, "per_s": rate,
                          "macs_per_s": rate * macs, "companion_share": share}
                         for core, rate, share in zip(cores, paired, shares)]
                print(f"  beside {beside:18s} {statistics.median(paired) / 1e9:6.2f} G/s a core: the companion "
                      f"takes {statistics.median(shares):5.2f} of a slot", flush=True)
    if args.out:
        import pandas as pd

        from specdec.study.io import write_csv

        write_csv(pd.DataFrame(rows), args.out)


if __name__ == "__main__":
    main()
