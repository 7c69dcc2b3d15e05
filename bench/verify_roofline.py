"""The multiplier's floor under a verify pass: how long the quantized products of a pass over m positions must take
on this CPU's vector multiply unit, counted from the instructions the built group functions issue, set beside the
pass's measured time and its bandwidth floor.

    python bench/verify_roofline.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--m 1 2 3 4 5 7]
                                    [--repeats 10] [--out roofline.csv]

1. Counts the instructions of each group function at 512 bits (specdec/native/_quant_groups.h, compiled into
   specdec.native._quant: group_q4_k_r16_512_N for N inputs, ...) a block of 16 rows x one quant block issues, from
   the disassembly (objdump) and the nesting of its loops: the loop over blocks runs once a block, the loop inside
   it four times (Q4_K's chunks, Q6_K's lane pairs). The count is checked against the block's multiply-adds (Q4_K:
   one vpdpbusd per 64, Q6_K: one vpmaddubsw per 64, for every input), so a compiler that nests the loops otherwise
   stops the count instead of skewing it.
2. Weighs each instruction by the share of a vpdpbusd slot it takes when issued beside vpdpbusd, measured in this
   run (bench/multiply_rate.py --beside): on the AMD EPYC Zen 4 vpdpwssd, vpmaddubsw, vpmulld and the float
   multiplies take a whole slot, shuffles and widenings a third, logic, shifts and loads none.
3. Per position: the blocks of each type a verify pass multiplies (every layer's matrices and the LM head) x their
   slots / (vpdpbusd's rate a core x the threads): the products' floor. The attention's fp32 multiply-adds (8-wide,
   half a slot each) are added beside it.
4. Times the pass at each m with the session the model loads by default (its kernel plan), interleaved, the read
   bandwidth measured after each round, as bench/lean_step.py does.

Prints the counts, then per m: T(m), the bytes floor, the multiplier floor, and the least T(m)/T(1) the two floors
allow (the larger of them over the measured T(1)): a pass cannot run below either. Run it alone on the machine."""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from gguf import GGUFReader

import multiply_rate
from lean_step import BANDWIDTH_BYTES, floor_ratios
from specdec.gguf import quant
from specdec.gguf.lean import LeanLM
from specdec.study.cost.profiling import memory_bandwidth
from specdec.study.io import write_csv

BLOCK_VALUES = {"Q4_K": 256, "Q6_K": 256}  # values a block holds per row (the group functions counted here)
MOST_INPUTS = 8  # R16_K_INPUTS: inputs one pass of a K-quant group function takes
INNER_TRIPS = 4  # the loop inside the block loop: Q4_K's four chunks, Q6_K's four lane pairs
# The instruction whose count per block and input is the block's multiply-adds / 64 (the check on the count)
CORE = {"Q4_K": "vpdpbusd", "Q6_K": "vpmaddubsw"}
# Mnemonics weighed as the companion bench/multiply_rate.py measured (the same unit, the same form, or a sibling)
WEIGHED_AS = {
    "vpdpwssd": "vpdpwssd", "vpmaddubsw": "vpmaddubsw", "vpmaddwd": "vpmaddwd", "vpmulld": "vpmulld",
    "vmulps": "vmulps", "vpternlogd": "vpternlogd", "vpshufb": "vpshufb", "vpmovsxbw": "vpmovsxbw",
    "vpmovzxbw": "vpmovsxbw", "vpmovzxbd": "vpmovzxbd", "vcvtph2ps": "vcvtph2ps", "vcvtdq2ps": "vcvtdq2ps",
    "vaddps": "vaddps", "vpaddd": "vpaddd", "vpsubd": "vpaddd", "vpsllw": "vpsllw", "vpslld": "vpsllw",
    "vpsrlw": "vpsrlw", "vpandd": "vpandd", "vpandq": "vpandd", "vpxor": "vpandd", "vpxord": "vpandd",
    "vpxorq": "vpandd", "vxorps": "vpandd",
}
FMA = re.compile(r"^vf(n?)m(add|sub)(132|213|231)ps$")
MOVES = re.compile(r"^(vmov|vzeroupper|prefetch)")  # moves, loads, stores, prefetches: no multiply slot
LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")


def disassembly(library: str, function: str) -> list[tuple[int, str, str]]:
    """(address, mnemonic, operands) of each instruction of `function` in the shared library."""
    if shutil.which("objdump") is None:
        sys.exit("verify_roofline: needs objdump (binutils) to count the group functions' instructions")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={function}", library],
                          check=True, capture_output=True, text=True).stdout
    out = [(int(m.group(1), 16), m.group(2), m.group(3)) for line in text.splitlines() if (m := LINE.match(line))]
    if not out:
        raise RuntimeError(f"verify_roofline: no {function} in {library} (a build without the AVX-512 kernels?)")
    return out


def _target(operands: str) -> int | None:
    match = re.match(r"([0-9a-f]+)\s", operands + " ")
    return int(match.group(1), 16) if match else None


def trips_per_block(code: list[tuple[int, str, str]]) -> list[int]:
    """How many times each instruction runs per block: 0 outside the block loop (once a call), 1 in it, INNER_TRIPS
    in the loop inside it. A loop is a backward branch and the code between its target and it. A stretch of code
    after every loop that jumps back into one is not a loop but the taken side of a branch the compiler moved out of
    line: it runs as often as the loop it jumps back into."""
    def backward(i: int) -> int | None:
        address, mnemonic, operands = code[i]
        target = _target(operands) if mnemonic.startswith("j") else None
        return target if target is not None and target <= address else None

    conditional = [(backward(i), code[i][0]) for i in range(len(code))
                   if code[i][1] != "jmp" and backward(i) is not None]

    def inside(address: int, loops) -> int:
        return sum(start <= address <= end for start, end in loops)

    loops, out_of_line, stretch_start = list(conditional), [], 0
    for i, (address, mnemonic, _) in enumerate(code):
        if mnemonic == "jmp" and (target := backward(i)) is not None:
            stretch = [a for a, _, _ in code[stretch_start:i + 1]]
            if inside(target, conditional) and not any(inside(a, conditional) for a in stretch):
                out_of_line.append((stretch_start, i, target))
            else:
                loops.append((target, address))
        if mnemonic == "jmp" or mnemonic.startswith("ret"):
            stretch_start = i + 1
    depths = [inside(address, loops) for address, _, _ in code]
    for first, last, target in out_of_line:
        depths[first:last + 1] = [inside(target, loops)] * (last + 1 - first)
    if max(depths) > 2:
        raise RuntimeError(f"verify_roofline: loops nested {max(depths)} deep, this count assumes two")
    return [(0, 1, INNER_TRIPS)[d] for d in depths]


def block_counts(qtype: str, inputs: int, library: str) -> dict[str, int]:
    """Each mnemonic's count per block of the group function for `qtype` at `inputs` inputs."""
    name = f"group_{qtype.lower()}_r16_512_{inputs}"
    code = disassembly(library, name)
    counts: dict[str, int] = {}
    for (_, mnemonic, _), trips in zip(code, trips_per_block(code)):
        if trips:
            counts[mnemonic] = counts.get(mnemonic, 0) + trips
    expected = inputs * BLOCK_VALUES[qtype] * 16 // 64
    if counts.get(CORE[qtype], 0) != expected:
        raise RuntimeError(f"verify_roofline: {name} issues {counts.get(CORE[qtype], 0)} {CORE[qtype]} a block, the "
                           f"block's multiply-adds need {expected}: its loops are not nested as this count assumes")
    return counts


def weight_of(mnemonic: str, operands: str = "") -> str | None:
    """The companion whose measured share weighs this mnemonic; "" for none taken (moves, loads, the base
    vpdpbusd is weighed 1 apart); None where nothing measured stands for it."""
    if mnemonic == "vpdpbusd":
        return "vpdpbusd"
    if FMA.match(mnemonic):
        return "vfmadd231ps"
    if mnemonic in ("vpbroadcastd", "vbroadcastss", "vbroadcasti32x4"):
        return "vpbroadcastd-load"
    if MOVES.match(mnemonic) or mnemonic.startswith(("cmp", "add", "sub", "lea", "mov", "j", "inc", "dec", "push",
                                                     "pop", "test", "and", "shl", "sar", "imul", "nop", "xor",
                                                     "ret", "cltq", "cs", "data16")):
        return ""
    return WEIGHED_AS.get(mnemonic)


def slots(counts: dict[str, int], shares: dict[str, float]) -> tuple[float, list[str]]:
    """A block's multiply slots (vpdpbusd 1, the rest by their measured shares) and the mnemonics not weighed."""
    total, unweighed = 0.0, []
    for mnemonic, count in counts.items():
        key = weight_of(mnemonic)
        if key is None:
            unweighed.append(mnemonic)
        elif key == "vpdpbusd":
            total += count
        elif key:
            total += count * max(shares.get(key, 0.0), 0.0)
    return total, sorted(unweighed)


def split_inputs(m: int) -> list[int]:
    """The passes a group function makes over m inputs: MOST_INPUTS at a time, the rest last."""
    return [MOST_INPUTS] * (m // MOST_INPUTS) + ([m % MOST_INPUTS] if m % MOST_INPUTS else [])


def verify_macs(path: str) -> dict[str, int]:
    """Multiply-adds a position costs in each quant type: every layer's matrices and the LM head (the embedding's
    table where the head is tied to it)."""
    reader = GGUFReader(path)
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    macs: dict[str, int] = {}
    for tensor in reader.tensors:
        if len(tensor.shape) == 2 and (tensor.name.startswith("blk.") or tensor.name == head):
            qtype = tensor.tensor_type.name
            macs[qtype] = macs.get(qtype, 0) + int(tensor.n_elements)
    return macs


def measure_shares(rounds: int) -> tuple[float, dict[str, float]]:
    """vpdpbusd's rate a core (both cores at once) and each companion's share of its slot, measured now."""
    companions = multiply_rate.runnable_companions(multiply_rate.cpu_flags())
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        binary = multiply_rate.build_probe(["zmm-vpdpbusd"], Path(tmp), companions)
        multiply_rate.rate_per_core(binary, "zmm-vpdpbusd", cores, rounds)  # warm-up
        shares, alone_rates = {}, []
        for companion in companions:  # alone and paired in turn, three times: the host's speed drifts
            runs = [(multiply_rate.rate_per_core(binary, "zmm-vpdpbusd", cores, rounds),
                     multiply_rate.rate_per_core(binary, f"zmm-vpdpbusd+{companion}", cores, rounds))
                    for _ in range(3)]
            alone = [rate for run in runs for rate in run[0]]
            alone_rates += alone
            shares[companion] = multiply_rate.companion_share(
                statistics.median(alone), statistics.median(rate for run in runs for rate in run[1]))
    return statistics.median(alone_rates), shares


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--m", nargs="+", type=int, default=[1, 2, 3, 4, 5, 7])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10_000_000, help="the probe's rounds a measurement")
    parser.add_argument("--out", default=None, help="CSV of the floors and times per m")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1 or min(args.m) < 1:
        parser.error("--repeats, --rounds and every --m must be at least 1")
    if 1 not in args.m:
        parser.error("--m must include 1: the floors are set against T(1)")
    if not {"avx512f", "avx512bw", "avx512_vnni"} <= multiply_rate.cpu_flags():
        sys.exit("verify_roofline: counts the 512-bit group functions; this CPU has no AVX512-VNNI")
    torch.set_num_threads(args.threads)
    library = quant._quant.__file__
    macs = verify_macs(args.gguf)
    unsupported = sorted(set(macs) - set(BLOCK_VALUES))
    if unsupported:
        sys.exit(f"verify_roofline: counts Q4_K and Q6_K group functions; {args.gguf} also has {unsupported}")

    rate, shares = measure_shares(args.rounds)
    print(f"zmm vpdpbusd: {rate / 1e9:.2f} G a second a core ({len(os.sched_getaffinity(0))} cores at once); slot "
          "shares beside it: " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()), flush=True)
    per_block: dict[tuple[str, int], float] = {}
    for qtype in macs:
        for n in sorted({n for m in args.m for n in split_inputs(m)}):
            counts = block_counts(qtype, n, library)
            per_block[qtype, n], unweighed = slots(counts, shares)
            weighed = {k: v for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
                       if (w := weight_of(k)) and (w == "vpdpbusd" or shares.get(w, 0) > 0.05)}
            print(f"{qtype} {n} inputs: {per_block[qtype, n]:.1f} slots a block of 16 x {BLOCK_VALUES[qtype]} "
                  f"({per_block[qtype, n] / n:.1f} an input; {BLOCK_VALUES[qtype] * 16 // 64} would be one slot "
                  f"per 64 multiply-adds): " + ", ".join(f"{k} {v}" for k, v in weighed.items())
                  + (f"; not weighed: {unweighed}" if unweighed else ""), flush=True)

    config = GGUFReader(args.gguf)
    arch = str(bytes(config.fields["general.architecture"].parts[-1]), "utf-8")
    n_head = int(config.fields[f"{arch}.attention.head_count"].parts[-1][0])
    n_layer = int(config.fields[f"{arch}.block_count"].parts[-1][0])
    n_embd = int(config.fields[f"{arch}.embedding_length"].parts[-1][0])
    head_dim = n_embd // n_head

    def multiply_floor(m: int) -> float:
        return sum(macs[q] / (16 * BLOCK_VALUES[q]) * sum(per_block[q, n] for n in split_inputs(m))
                   for q in macs) / (rate * args.threads)

    def attention_floor(m: int) -> float:
        # q.k and p.v over the context and the pass's own positions: 8-wide fp32 FMAs, half a slot each on a CPU
        # whose 512-bit multiply slot is two 256-bit halves (the Zen 4); an upper estimate of their slot elsewhere
        fmas = sum(2 * n_head * head_dim * (args.context + i + 1) for i in range(m)) * n_layer
        return fmas / 8 * 0.5 * shares.get("vfmadd231ps", 1.0) / (rate * args.threads)

    session = LeanLM(args.gguf)
    print(f"session: kernel plan ({session.model.plan.source}) {session.model.plan.label()}", flush=True)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, session.vocab_size, (args.context,), generator=generator).tolist()
    tokens = torch.randint(0, session.vocab_size, (max(args.m),), generator=generator).tolist()
    session.extend(context, 1)
    times = {m: [] for m in args.m}
    bandwidths = []
    for repeat in range(args.repeats + 1):  # the first round warms up
        for m in args.m[repeat % len(args.m):] + args.m[:repeat % len(args.m)]:
            start = time.perf_counter()
            session.extend(tokens[:m], m)
            if repeat:
                times[m].append(time.perf_counter() - start)
            session.crop(args.context)
        if repeat:
            bandwidths.append(memory_bandwidth(BANDWIDTH_BYTES, repeats=3))
    bandwidth = statistics.median(bandwidths)
    step_bytes = session.step_bytes()
    one = statistics.median(times[1])
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s [{min(bandwidths) / 1e9:.1f}, {max(bandwidths) / 1e9:.1f}]; "
          f"{step_bytes / 1e9:.3f} GB a pass; {args.threads} threads, context {args.context}")
    rows = []
    for m in args.m:
        bytes_floor = step_bytes / bandwidth
        products, attention = multiply_floor(m), attention_floor(m)
        bound = max(bytes_floor, products + attention)
        median = statistics.median(times[m])
        rows.append({"m": m, "seconds": median, "seconds_min": min(times[m]), "seconds_max": max(times[m]),
                     "over_bytes_floor": statistics.median(floor_ratios(times[m], step_bytes, bandwidths)),
                     "bytes_floor_s": bytes_floor, "products_floor_s": products, "attention_floor_s": attention,
                     "over_m1": median / one, "least_over_m1": bound / one, "bandwidth_gb_s": bandwidth / 1e9,
                     "vpdpbusd_per_s": rate, "repeats": args.repeats})
        print(f"m {m}: {median * 1e3:6.1f} ms [{min(times[m]) * 1e3:.1f}, {max(times[m]) * 1e3:.1f}]  bytes floor "
              f"{bytes_floor * 1e3:5.1f} ms  multiplier floor {products * 1e3:5.1f} + attention {attention * 1e3:4.1f} "
              f"ms  T(m)/T(1) {median / one:.2f}, the floors allow {bound / one:.2f}; the pass "
              f"{median / (products + attention):.2f}x its multiplier floor", flush=True)
    if args.out:
        write_csv(pd.DataFrame(rows), args.out)


if __name__ == "__main__":
    main()
