"""The group functions' multiply-add rate on one core, per quantized type, kernel and inputs a pass: how near a
verify pass's products come to the arithmetic ceiling, with no memory to wait for or with the weights streaming.

    python bench/group_rate.py [--types q4_k q6_k q5_0 q8_0] [--kernels avx2 ...] [--inputs 1 2 3 4 5 7 8]
                               [--modes l2 stream] [--rounds 5] [--work 1.0] [--out rate.csv]

Builds bench/group_rate.c against specdec/native/_quant_kernels.h with the native modules' flags (the group
functions as the installed modules compile them) and runs it pinned to the first core, one cell at a time: 16-row
groups of a 1536-wide matrix, either 16 groups multiplied again and again (in L2) or 28 layers of 8960 rows
streaming from memory (as a verify pass reads them), the weights on 2 MB pages and every scale a normal number, as
in a model (bench/group_rate.c says what 4 KB pages and arbitrary bytes cost: before the twenty-third run's fix the
probe's floats were partly subnormal or NaN, its 512-bit rates at 3 inputs and more about half the true ones, and
its streams TLB-bound). On avx2 it also runs the Q4_K group step alone
("step-ceiling": the load, the nibble unpacking and per input two broadcasts, two vpmaddubsw and two vpaddw, in
registers and in the written order: no scales, mins, flush or prefetch); the group function's other work costs the
gap between its rate and that one. Prints G multiply-adds a second per cell, the median of the rounds [min, max]
(--work scales a round's passes: 2000 in L2, 2 streaming, 2 million steps for the ceiling); --out writes one row
per cell (CSV, atomically). Run it alone on the machine: a neighbour on a shared host only ever slows a cell down."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from specdec.gguf import quant
from specdec.native.build import COMPILE_ARGS, LINK_ARGS
from specdec.study.io import write_csv

NATIVE = Path(__file__).resolve().parents[1] / "specdec" / "native"
PROBE = Path(__file__).with_name("group_rate.c")
TYPES = ("q4_k", "q6_k", "q5_0", "q8_0")
MOST_INPUTS = {"q4_k": 8, "q6_k": 8, "q5_0": 4, "q8_0": 4}  # R16_K_INPUTS, R16_INPUTS
GROUP_KERNELS = ("avx2", "avx512-vnni-256", "avx512-vnni")  # amx runs the 512-bit group functions below 13 rows


def build_probe(where: Path, optimise: list[str] = COMPILE_ARGS) -> Path:
    """The probe, built as the native modules are (`optimise`: their flags; the tests build it unoptimised, in a
    few seconds rather than twenty, to check what it refuses and writes, not its rates)."""
    if shutil.which("gcc") is None:
        sys.exit("group_rate: needs gcc to build its probe")
    binary = where / "group_rate"
    subprocess.run(["gcc", *optimise, "-Wno-unused-function", "-Wno-unused-variable", f"-I{NATIVE}",
                    "-o", str(binary), str(PROBE), *LINK_ARGS, "-lm"], check=True)
    return binary


REPS = {"l2": 2000, "stream": 2, "step-ceiling": 2_000_000}  # a round's passes (steps) at --work 1


def run_cell(binary: Path, args: list[str], rounds: int, reps: int | None = None) -> list[float]:
    """The probe's rate each round (G multiply-adds a second), pinned to the first core this process may use."""
    core = min(os.sched_getaffinity(0))
    extra = [str(reps)] if reps is not None else []
    done = subprocess.run([str(binary), *args, str(rounds), *extra], capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    if done.returncode:
        raise RuntimeError(f"group_rate: the probe failed on {' '.join(args)}: {done.stderr.strip()}")
    return [float(line.split()[1]) for line in done.stdout.splitlines()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="default: every group kernel this CPU runs (avx2, avx512-vnni-256, avx512-vnni)")
    parser.add_argument("--inputs", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--modes", nargs="+", default=["l2", "stream"], choices=("l2", "stream"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=float, default=1.0, help="a round's passes, as a multiple of the default")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the avx2 Q4_K step-ceiling cells")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs = [k for k in quant.kernels() if k in GROUP_KERNELS]
    kernels = args.kernels or runs
    missing = [k for k in kernels if k not in runs]
    if missing:
        parser.error(f"{missing}: not group kernels this CPU runs (it runs {runs})")
    if args.rounds < 1 or args.work <= 0 or any(n < 1 or n > 8 for n in args.inputs):
        parser.error("--rounds must be at least 1, --work above 0 and --inputs from 1 to 8")
    cells = [(t, k, mode, n) for t in args.types for k in kernels for mode in args.modes for n in args.inputs
             if n <= MOST_INPUTS[t]]
    if "avx2" in kernels and not args.no_ceiling:
        cells += [("q4_k", "avx2", "step-ceiling", n) for n in args.inputs]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_probe(Path(tmp))
        for qtype, kernel, mode, nx in cells:
            probe_args = ["step-ceiling", str(nx)] if mode == "step-ceiling" else [qtype, kernel, mode, str(nx)]
            rates = run_cell(binary, probe_args, args.rounds, max(1, round(REPS[mode] * args.work)))
            rows.append({"type": qtype, "kernel": kernel, "mode": mode, "inputs": nx,
                         "gmacs_median": statistics.median(rates), "gmacs_min": min(rates), "gmacs_max": max(rates),
                         "rounds": len(rates)})
            print(f"{qtype} {kernel:15s} {mode:12s} {nx} inputs: {statistics.median(rates):6.1f} G multiply-adds/s "
                  f"[{min(rates):.1f}, {max(rates):.1f}]", flush=True)
    if args.out:
        write_csv(pd.DataFrame(rows), args.out)


if __name__ == "__main__":
    main()
