"""The multiplier's floor under a verify pass: how long the quantized products of a pass over m positions must take
on this CPU's vector multiply unit, counted from the instructions the built group functions issue, set beside the
pass's measured time and its bandwidth floor.

    python bench/verify_roofline.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--m 1 2 3 4 5 7]
                                    [--repeats 10] [--out roofline.csv]

1. Counts the instructions each group function at 512 bits (specdec/native/_quant_groups.h, compiled into
   specdec.native._quant: group_q4_k_r16_512_N for N inputs, ...) runs for a block of 16 rows x one quant block:
   a forked child calls it over one block and over two, single-stepped with ptrace, and each address it runs is
   named from the disassembly (objdump); the difference is one block's. Exact whatever the compiler unrolled, and
   checked against the block's multiply-adds (Q4_K: one vpdpbusd per 64 for every input; Q6_K: one vpmaddubsw).
2. Weighs each instruction by the share of a vpdpbusd slot it takes when issued beside vpdpbusd, measured in this
   run (bench/multiply_rate.py --beside): on the AMD EPYC Zen 4 vpdpwssd, vpmaddubsw, vpmulld and the float
   multiplies take a whole slot, shuffles and widenings a third, logic, shifts and loads none.
3. Per position: the blocks of each type a verify pass multiplies (every layer's matrices and the LM head) x their
   slots / (vpdpbusd's rate a core x the threads): the products' floor. The attention's fp32 multiply-adds (8-wide,
   half a slot each) are added beside it.
4. Times each type's products alone, in cache (a layer matrix of the file, at most 12 MB, multiplied again and
   again from the last-level cache): how near the kernels come to their counted slots with no memory to wait for.
5. Times the pass at each m with the session the model loads by default (its kernel plan), interleaved, the read
   bandwidth measured after each round, as bench/lean_step.py does.

Prints the counts, then per m: T(m), the bytes floor, the multiplier floor, and the least T(m)/T(1) the two floors
allow (the larger of them over the measured T(1)): a pass cannot run below either. Run it alone on the machine."""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from gguf import GGUFReader

import multiply_rate
from lean_step import BANDWIDTH_BYTES, floor_ratios
from specdec.gguf import quant
from specdec.gguf.lean import LeanLM
from specdec.gguf.quant import QuantMatrix
from specdec.study.cost.profiling import memory_bandwidth
from specdec.study.io import write_csv

BLOCK_VALUES = {"Q4_K": 256, "Q6_K": 256}  # values a block holds per row (the group functions counted here)
MOST_INPUTS = 8  # R16_K_INPUTS: inputs one pass of a K-quant group function takes
HOT_BYTES = 12 * 2**20  # the most weight bytes of an in-cache product: well inside a 32 MB last-level cache
HOT_CALLS = 8
# The instruction whose count per block and input is the block's multiply-adds / 64 (the check on the count)
CORE = {"Q4_K": "vpdpbusd", "Q6_K": "vpmaddubsw"}
# Mnemonics weighed as the companion bench/multiply_rate.py measured (the same unit, the same form, or a sibling)
WEIGHED_AS = {
    "vpdpwssd": "vpdpwssd", "vpmaddubsw": "vpmaddubsw", "vpmaddwd": "vpmaddwd", "vpmulld": "vpmulld",
    "vmulps": "vmulps", "vpternlogd": "vpternlogd", "vpshufb": "vpshufb", "vpmovsxbw": "vpmovsxbw",
    "vpmovzxbw": "vpmovsxbw", "vpmovzxbd": "vpmovzxbd", "vcvtph2ps": "vcvtph2ps", "vcvtdq2ps": "vcvtdq2ps",
    "vaddps": "vaddps", "vpaddd": "vpaddd", "vpsubd": "vpaddd", "vpsllw": "vpsllw", "vpslld": "vpsllw",
    "vpsrlw": "vpsrlw", "vpandd": "vpandd", "vpandq": "vpandd", "vpxor": "vpandd", "vpxord": "vpandd",
    "vpxorq": "vpandd", "vxorps": "vpandd", "vmovdqa32": "vmovdqa32", "vmovdqa64": "vmovdqa32",
    "vmovaps": "vmovdqa32",
}
FMA = re.compile(r"^vf(n?)m(add|sub)(132|213|231)ps$")
MOVES = re.compile(r"^(vmov|vzeroupper|prefetch)")  # moves, loads, stores, prefetches
MEMORY = " (memory)"  # an instruction's count key where an operand is in memory
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


PTRACE_TRACEME, PTRACE_PEEKTEXT, PTRACE_PEEKUSER, PTRACE_POKETEXT, PTRACE_POKEUSER = 0, 1, 3, 4, 6
PTRACE_CONT, PTRACE_SINGLESTEP = 7, 9
RIP, RSP = 16 * 8, 19 * 8  # the offsets of rip and rsp in struct user_regs_struct (x86-64)
ACT_BYTES = 4096  # room for one block's quantised activations (act_k) an input: more than the struct needs
BLOCK_BYTES = {"Q4_K": 16 * 148, "Q6_K": 16 * 210}  # a group's block in the 16-row layouts


def function_address(library: str, function: str) -> tuple[int, int]:
    """(address in this process, size in bytes) of a local symbol of an already loaded shared library."""
    listing = subprocess.run(["nm", "-S", library], check=True, capture_output=True, text=True).stdout
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == function:
            offset, size = int(parts[0], 16), int(parts[1], 16)
            break
    else:
        raise RuntimeError(f"verify_roofline: no {function} in {library} (a build without the AVX-512 kernels?)")
    real = os.path.realpath(library)
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and os.path.realpath(fields[5]) == real and int(fields[2], 16) == 0:
            return int(fields[0].split("-")[0], 16) + offset, size
    raise RuntimeError(f"verify_roofline: {library} is not loaded in this process")


def executed(address: int, size: int, call) -> list[int]:
    """The addresses inside [address, address + size) a forked child runs through in one call of the function at
    `address` (made by `call()`), each as often as it ran. The child runs to a breakpoint on the function's first
    instruction, then is single-stepped with ptrace until it is back at the return address, so the count is exact
    whatever the compiler unrolled or moved out of line."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    pid = os.fork()
    if pid == 0:  # the child: stop for the parent, run the call, leave without Python's teardown
        try:
            libc.ptrace(PTRACE_TRACEME, 0, None, None)
            os.kill(os.getpid(), signal.SIGSTOP)
            call()
        finally:
            os._exit(0)

    def ptrace(request: int, where: int = 0, data: int = 0) -> int:
        ctypes.set_errno(0)
        value = libc.ptrace(request, pid, ctypes.c_void_p(where), ctypes.c_void_p(data))
        if value == -1 and ctypes.get_errno():
            raise OSError(ctypes.get_errno(), f"verify_roofline: ptrace request {request} on the child failed")
        return value & 0xFFFFFFFFFFFFFFFF

    def wait_stopped() -> None:
        _, status = os.waitpid(pid, 0)
        if not os.WIFSTOPPED(status):
            raise RuntimeError("verify_roofline: the child ended before its call returned")

    try:
        wait_stopped()  # its SIGSTOP
        word = ptrace(PTRACE_PEEKTEXT, address)
        ptrace(PTRACE_POKETEXT, address, (word & ~0xFF) | 0xCC)  # int3 on the first instruction
        ptrace(PTRACE_CONT)
        wait_stopped()
        ptrace(PTRACE_POKETEXT, address, word)
        ptrace(PTRACE_POKEUSER, RIP, address)  # back over the int3
        back = ptrace(PTRACE_PEEKTEXT, ptrace(PTRACE_PEEKUSER, RSP))  # the return address
        seen, rip = [], address
        while rip != back:
            if address <= rip < address + size:
                seen.append(rip)
            ptrace(PTRACE_SINGLESTEP)
            wait_stopped()
            rip = ptrace(PTRACE_PEEKUSER, RIP)
        return seen
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def block_counts(qtype: str, inputs: int, library: str) -> dict[str, int]:
    """Each mnemonic's count per block of the group function for `qtype` at `inputs` inputs: the instructions a
    call over two blocks runs less those of a call over one, both single-stepped (`executed`), with every prefetch
    asked for, as in the middle of a matrix. Checked against the block's multiply-adds."""
    name = f"group_{qtype.lower()}_r16_512_{inputs}"
    address, size = function_address(library, name)
    key_at = {a: m + (MEMORY if "(" in operands else "") for a, m, operands in disassembly(library, name)}
    static_start = min(key_at)
    function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_void_p)(address)

    def run(blocks: int) -> dict[str, int]:
        weights = ctypes.create_string_buffer(BLOCK_BYTES[qtype] * blocks)
        acts = [ctypes.create_string_buffer(ACT_BYTES * blocks) for _ in range(inputs)]
        rows = (ctypes.c_void_p * inputs)(*[ctypes.addressof(a) for a in acts])
        out = ctypes.create_string_buffer(4 * 16 * inputs)
        counts: dict[str, int] = {}
        for rip in executed(address, size, lambda: function(weights, rows, blocks, blocks + 1000, out)):
            key = key_at[rip - address + static_start]
            counts[key] = counts.get(key, 0) + 1
        return counts

    one, two = run(1), run(2)
    counts = {m: two[m] - one.get(m, 0) for m in two if two[m] != one.get(m, 0)}
    expected = inputs * BLOCK_VALUES[qtype] * 16 // 64
    core = counts.get(CORE[qtype], 0) + counts.get(CORE[qtype] + MEMORY, 0)
    if core != expected:
        raise RuntimeError(f"verify_roofline: {name} ran {core} {CORE[qtype]} a block, the block's multiply-adds "
                           f"need {expected}")
    return counts


def weight_of(key: str) -> str | None:
    """The companion whose measured share weighs an instruction (`key`: its mnemonic, with " (memory)" where an
    operand is in memory); "" for none taken (loads, stores, prefetches, scalar work); None where nothing measured
    stands for it. vpdpbusd itself is the unit."""
    mnemonic, memory = key.removesuffix(MEMORY), key.endswith(MEMORY)
    if mnemonic == "vpdpbusd":
        return "vpdpbusd"
    if FMA.match(mnemonic):
        return "vfmadd231ps"
    if mnemonic in ("vpbroadcastd", "vbroadcastss", "vbroadcasti32x4"):
        return "vpbroadcastd-load" if memory else "vpshufb"
    if MOVES.match(mnemonic):
        return "vmovdqa32" if mnemonic in WEIGHED_AS and not memory else ""
    if not mnemonic.startswith("v") and not mnemonic.startswith("k"):
        return ""  # scalar: address arithmetic, loop control
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


def measure_shares(rounds: int, pairs: int) -> tuple[float, dict[str, float]]:
    """vpdpbusd's best rate a core (every core at once) and each companion's share of its slot, measured now
    (multiply_rate.best_of_pairs)."""
    companions = multiply_rate.runnable_companions(multiply_rate.cpu_flags())
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        binary = multiply_rate.build_probe(["zmm-vpdpbusd"], Path(tmp), companions)
        multiply_rate.rate_per_core(binary, "zmm-vpdpbusd", cores, rounds)  # warm-up
        shares, alone_rates = {}, []
        for companion in companions:
            alone, paired = multiply_rate.best_of_pairs(binary, "zmm-vpdpbusd", f"zmm-vpdpbusd+{companion}", cores,
                                                        rounds, pairs)
            alone_rates += alone
            shares[companion] = multiply_rate.companion_share(statistics.median(alone), statistics.median(paired))
    return statistics.median(alone_rates), shares


def hot_matrix(path: str, qtype: str, most_bytes: int) -> QuantMatrix | None:
    """The file's first layer matrix of `qtype` (cut to its first rows where it holds more than `most_bytes`; whole
    groups of 16), in groups of 16 rows: it stays in the last-level cache while it is multiplied again and again,
    and its calls are long enough that a call's own cost is a small part of them."""
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type.name == qtype and len(tensor.shape) == 2 and tensor.name.startswith("blk."):
            raw = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(tensor.data.shape[0], -1))
            cut = min(raw.shape[0], most_bytes // raw.shape[1]) // 16 * 16
            return QuantMatrix(raw[:cut].clone(), qtype, int(tensor.shape[0]), tensor.name).in_layout("r16")
    return None


def time_hot(matrix: QuantMatrix, ms: list[int], repeats: int, kernel: str) -> dict[int, float]:
    """Seconds of one product of `matrix` (in cache: HOT_CALLS in a row, the first call's reading dropped) per input
    count, interleaved, medians over repeats. A call's own cost (quantising the inputs, the threads' start and
    join) is in it."""
    inputs = {m: torch.randn(m, matrix.in_features) for m in ms}
    times = {m: [] for m in ms}
    with quant.use_kernel(kernel):
        for repeat in range(repeats + 1):
            for m in ms[repeat % len(ms):] + ms[:repeat % len(ms)]:
                matrix.matmul(inputs[m])
                start = time.perf_counter()
                for _ in range(HOT_CALLS):
                    matrix.matmul(inputs[m])
                if repeat:
                    times[m].append((time.perf_counter() - start) / HOT_CALLS)
    return {m: statistics.median(t) for m, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--m", nargs="+", type=int, default=[1, 2, 3, 4, 5, 7])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10_000_000, help="the probe's rounds a measurement")
    parser.add_argument("--pairs", type=int, default=multiply_rate.PAIRS,
                        help="alone-then-paired runs each slot share is the best of")
    parser.add_argument("--out", default=None, help="CSV of the floors and times per m")
    args = parser.parse_args(argv)
    if min(args.repeats, args.rounds, args.pairs, *args.m) < 1:
        parser.error("--repeats, --rounds, --pairs and every --m must be at least 1")
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

    rate, shares = measure_shares(args.rounds, args.pairs)
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

    # The products alone, in cache: how near their kernels run to the slots counted above
    hot_rows = []
    for qtype in macs:
        matrix = hot_matrix(args.gguf, qtype, HOT_BYTES)
        if matrix is None:
            continue
        seconds = time_hot(matrix, args.m, args.repeats, "avx512-vnni")
        blocks = matrix.out_features // 16 * (matrix.in_features // BLOCK_VALUES[qtype])
        for m in args.m:
            counted = blocks * sum(per_block[qtype, n] for n in split_inputs(m)) / (rate * args.threads)
            hot_rows.append({"qtype": qtype, "m": m, "seconds": seconds[m], "slots_floor_s": counted})
        print(f"{qtype} {matrix.name} {matrix.out_features}x{matrix.in_features} in cache: " + ", ".join(
            f"m{r['m']} {r['seconds'] * 1e6:.0f} us ({r['seconds'] / r['slots_floor_s']:.2f}x its slots)"
            for r in hot_rows if r["qtype"] == qtype), flush=True)

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
        write_csv(pd.DataFrame(hot_rows), str(Path(args.out).with_suffix("")) + ".in_cache.csv")


if __name__ == "__main__":
    main()
