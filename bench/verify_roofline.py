"""The multiplier's floor under a verify pass: how long the quantized products of a pass over m positions must take
on this CPU's vector multiply unit, counted from the instructions the built product functions issue, set beside the
pass's measured time and its bandwidth floor.

    python bench/verify_roofline.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--m 1 2 3 4 5 7]
                                    [--repeats 10] [--out roofline.csv]

Two kernel families (FAMILIES), by the kernel the model's plan runs verify passes on (KernelPlan.pass_kernel): for
avx512-vnni and amx the 512-bit group functions (the unit: zmm vpdpbusd); for avx2 that kernel's functions in the
layout the plan runs for verify passes (group functions for groups of 16 rows, row functions for the file's rows;
the unit: ymm vpmaddubsw, its only integer multiply-add).
1. Counts the instructions each function (specdec/native/_quant_groups.h and _quant_rows.h, compiled into
   specdec.native._quant: group_q4_k_r16_512_N for N inputs, row_q6_k_N, ...) runs for a block (16 rows or one x
   one quant block): a forked child calls it over one block and over 1 + span (Counted), single-stepped with ptrace,
   and each address it runs is named from the disassembly (objdump); the difference over the span is one block's.
   Exact whatever the compiler unrolled, and checked against the block's multiply-adds (512 bits: Q4_K one
   vpdpbusd per 64 for every input, Q6_K one vpmaddubsw; avx2: one vpmaddubsw per 32).
2. Weighs each instruction by the share of a unit slot it takes when issued beside the unit, measured in this run
   (bench/multiply_rate.py --beside): on the AMD EPYC Zen 4 vpdpwssd, vpmaddubsw, vpmulld and the float multiplies
   take a whole slot, shuffles and widenings a third, logic, shifts and loads none.
3. Per position: the blocks of each type a verify pass multiplies (every layer's matrices and the LM head) x their
   slots / (the unit's rate a core x the threads): the products' floor. The attention's fp32 multiply-adds (8-wide:
   half a zmm FMA's slot, or a ymm FMA's own) are added beside it.
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
from dataclasses import dataclass
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

COUNTED_TYPES = ("Q4_K", "Q6_K")  # the quant types whose functions are counted (a row's block: Counted.values)
HOT_BYTES = 12 * 2**20  # the most weight bytes of an in-cache product: well inside a 32 MB last-level cache
HOT_CALLS = 8


@dataclass(frozen=True)
class Counted:
    """How one quant type's products are counted in a family: the function for n inputs (`name` with {n}), the rows
    a call's block spans (16: a group function, 1: a row function), the most inputs one call takes, the instruction
    whose count per block and input is the block's multiply-adds / `macs_per_core` (the check on the count), the
    bytes of one block of those rows, the blocks a count is averaged over (Q4_K's rows flush their integers once
    every eight blocks), and the values a row holds in a block."""

    name: str
    rows: int
    most_inputs: int
    core: str
    macs_per_core: int
    block_bytes: int
    span: int = 1
    values: int = 256

    def expected_core(self, inputs: int) -> int:
        return inputs * self.values * self.rows // self.macs_per_core

    def split_inputs(self, m: int) -> list[int]:
        """The calls a product over m inputs makes: most_inputs at a time, the rest last."""
        most = self.most_inputs
        return [most] * (m // most) + ([m % most] if m % most else [])


@dataclass(frozen=True)
class Family:
    """The kernel family a CPU's verify passes run, as the roofline counts it: the product kernel, the multiply whose
    slot is the unit (bench/multiply_rate.py), the mnemonic that is that multiply in the counts, the companions'
    names (multiply_rate.COMPANIONS) per mnemonic, an 8-wide fp32 multiply-add's share of the unit beside the
    measured one (the attention), and each quant type's counted functions per layout."""

    kernel: str
    unit: str
    unit_mnemonic: str
    weighed_as: dict
    fma: str
    fma_factor: float
    counted: dict  # (qtype, layout) -> Counted

    @property
    def ymm(self) -> bool:
        """Whether its unit is a 256-bit multiply (its companions multiply_rate's ymm-* ones)."""
        return multiply_rate.is_256(self.unit)


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
# The same for the avx2 kernel's 256-bit forms (multiply_rate's ymm-* companions)
WEIGHED_AS_256 = {
    "vpmaddwd": "ymm-vpmaddwd", "vpmulld": "ymm-vpmulld", "vmulps": "ymm-vmulps", "vpshufb": "ymm-vpshufb",
    "vpmovsxbw": "ymm-vpmovsxbw", "vpmovzxbw": "ymm-vpmovsxbw", "vpmovzxbd": "ymm-vpmovzxbd",
    "vpmovsxbd": "ymm-vpmovzxbd", "vcvtph2ps": "ymm-vcvtph2ps", "vcvtdq2ps": "ymm-vcvtdq2ps", "vaddps": "ymm-vaddps",
    "vsubps": "ymm-vaddps", "vpaddd": "ymm-vpaddd", "vpsubd": "ymm-vpaddd", "vpaddw": "ymm-vpaddw",
    "vpsubw": "ymm-vpaddw", "vpaddb": "ymm-vpaddw", "vpsubb": "ymm-vpaddw", "vpsllw": "ymm-vpsllw",
    "vpslld": "ymm-vpsllw", "vpsllq": "ymm-vpsllw", "vpsrlw": "ymm-vpsrlw", "vpsrld": "ymm-vpsrlw",
    "vpsrlq": "ymm-vpsrlw", "vpsraw": "ymm-vpsrlw", "vpsrad": "ymm-vpsrlw", "vpand": "ymm-vpand", "vpor": "ymm-vpor",
    "vpxor": "ymm-vpand", "vxorps": "ymm-vpand", "vandps": "ymm-vpand", "vpermq": "ymm-vpermq",
    "vpermd": "ymm-vpermq", "vextracti128": "ymm-vpermq", "vextractf128": "ymm-vpermq", "vinserti128": "ymm-vpermq",
    "vmovdqa": "ymm-vmovdqa", "vmovdqu": "ymm-vmovdqa", "vmovaps": "ymm-vmovdqa", "vmovups": "ymm-vmovdqa",
    "vpinsrw": "ymm-vpshufb", "vpinsrd": "ymm-vpshufb", "vpunpcklqdq": "ymm-vpshufb", "vpunpckhqdq": "ymm-vpshufb",
    "vpunpckldq": "ymm-vpshufb", "vpunpckhdq": "ymm-vpshufb", "vshufps": "ymm-vpshufb", "vpshufd": "ymm-vpshufb",
    "vphaddd": "ymm-vpermq", "vperm2i128": "ymm-vpermq", "vpcmpgtd": "ymm-vpaddd", "vpcmpeqb": "ymm-vpaddd",
    "vpblendd": "ymm-vpand", "vblendvps": "ymm-vpand", "vpblendvb": "ymm-vpand", "vandnps": "ymm-vpand",
    "vpandn": "ymm-vpand", "vmaxps": "ymm-vaddps", "vminps": "ymm-vaddps",
}
FAMILIES = {
    # the AVX-512 kernels' 512-bit group functions (the avx512-vnni and amx kernels below 13 rows)
    "avx512-vnni": Family("avx512-vnni", "zmm-vpdpbusd", "vpdpbusd", WEIGHED_AS, "vfmadd231ps", 0.5, {
        ("Q4_K", "r16"): Counted("group_q4_k_r16_512_{n}", 16, 8, "vpdpbusd", 64, 16 * 148),
        ("Q6_K", "r16"): Counted("group_q6_k_r16_512_{n}", 16, 8, "vpmaddubsw", 64, 16 * 210)}),
    # the avx2 kernel (256-bit registers, no VNNI): its group functions (R16_K_AVX2_INPUTS 7 inputs a call) or its
    # rows (Q4_K GROUP 4 inputs a call, Q6_K Q6K_AVX2_ROW_GROUP 6), whichever the kernel plan runs
    "avx2": Family("avx2", "ymm-vpmaddubsw", "vpmaddubsw", WEIGHED_AS_256, "ymm-vfmadd231ps", 1.0, {
        ("Q4_K", "r16"): Counted("group_q4_k_r16_avx2_{n}", 16, 7, "vpmaddubsw", 32, 16 * 148),
        ("Q6_K", "r16"): Counted("group_q6_k_r16_avx2_{n}", 16, 7, "vpmaddubsw", 32, 16 * 210),
        ("Q4_K", "rows"): Counted("row_q4_k_{n}", 1, 4, "vpmaddubsw", 32, 144, span=8),
        ("Q6_K", "rows"): Counted("row_q6_k_{n}", 1, 6, "vpmaddubsw", 32, 210)}),
}


def family_for(kernel: str) -> Family:
    """The family of the product kernel a session's verify passes run on (KernelPlan.pass_kernel): the 512-bit group
    functions for avx512-vnni and amx (whose passes of few rows run them), the avx2 kernel's functions for avx2.
    On an Intel Xeon with AMX the plan may take avx2 for steps and another kernel for verify passes."""
    if kernel in ("avx512-vnni", "amx"):
        return FAMILIES["avx512-vnni"]
    if kernel == "avx2":
        return FAMILIES["avx2"]
    sys.exit(f"verify_roofline: counts the avx2 or the 512-bit kernels' functions; this session's verify passes run "
             f"{kernel}")
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
        raise RuntimeError(f"verify_roofline: no {function} in {library} (a build without that kernel?)")
    return out


PTRACE_TRACEME, PTRACE_PEEKTEXT, PTRACE_PEEKUSER, PTRACE_POKETEXT, PTRACE_POKEUSER = 0, 1, 3, 4, 6
PTRACE_CONT, PTRACE_SINGLESTEP = 7, 9
RIP, RSP = 16 * 8, 19 * 8  # the offsets of rip and rsp in struct user_regs_struct (x86-64)
ACT_BYTES = 4096  # room for one block's quantised activations (act_k) an input: more than the struct needs


def function_address(library: str, function: str) -> tuple[int, int]:
    """(address in this process, size in bytes) of a local symbol of an already loaded shared library."""
    listing = subprocess.run(["nm", "-S", library], check=True, capture_output=True, text=True).stdout
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == function:
            offset, size = int(parts[0], 16), int(parts[1], 16)
            break
    else:
        raise RuntimeError(f"verify_roofline: no {function} in {library} (a build without that kernel?)")
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

    def wait_stopped(expected: int = signal.SIGTRAP) -> None:
        _, status = os.waitpid(pid, 0)
        if not os.WIFSTOPPED(status):
            raise RuntimeError("verify_roofline: the child ended before its call returned")
        if os.WSTOPSIG(status) != expected:  # stepped again without it, a faulting instruction would fault forever
            raise RuntimeError(f"verify_roofline: the child stopped on {signal.Signals(os.WSTOPSIG(status)).name} "
                               "in the counted call (an instruction this CPU lacks?)")

    try:
        wait_stopped(signal.SIGSTOP)
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


def block_counts(counted: Counted, inputs: int, library: str) -> dict[str, float]:
    """Each mnemonic's count per block of the counted function at `inputs` inputs: the instructions a call over
    1 + span blocks runs less those of a call over one, over the span, both single-stepped (`executed`), with every
    prefetch asked for, as in the middle of a matrix. Checked against the block's multiply-adds. A group function
    takes (weights, inputs, blocks, blocks left in the matrix, out), a row function (weights, inputs, values, bytes
    left, out)."""
    name = counted.name.format(n=inputs)
    address, size = function_address(library, name)
    key_at = {a: m + (MEMORY if "(" in operands else "") for a, m, operands in disassembly(library, name)}
    static_start = min(key_at)
    function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_void_p)(address)

    def run(blocks: int) -> dict[str, int]:
        weights = ctypes.create_string_buffer(counted.block_bytes * blocks)
        acts = [ctypes.create_string_buffer(ACT_BYTES * blocks) for _ in range(inputs)]
        rows = (ctypes.c_void_p * inputs)(*[ctypes.addressof(a) for a in acts])
        out = ctypes.create_string_buffer(4 * 16 * inputs)
        if counted.rows == 1:  # a row: its values, and (for the prefetches) bytes far past its end
            size_arg, room = counted.values * blocks, counted.block_bytes * (blocks + 1000)
        else:
            size_arg, room = blocks, blocks + 1000
        counts: dict[str, int] = {}
        for rip in executed(address, size, lambda: function(weights, rows, size_arg, room, out)):
            key = key_at[rip - address + static_start]
            counts[key] = counts.get(key, 0) + 1
        return counts

    one, more = run(1), run(1 + counted.span)
    counts = {m: (more[m] - one.get(m, 0)) / counted.span for m in more if more[m] != one.get(m, 0)}
    expected = counted.expected_core(inputs)
    core = counts.get(counted.core, 0) + counts.get(counted.core + MEMORY, 0)
    if core != expected:
        raise RuntimeError(f"verify_roofline: {name} ran {core} {counted.core} a block, the block's multiply-adds "
                           f"need {expected}")
    return counts


def weight_of(key: str, family: Family = FAMILIES["avx512-vnni"]) -> str | None:
    """The companion whose measured share weighs an instruction (`key`: its mnemonic, with " (memory)" where an
    operand is in memory); "" for none taken (loads, stores, prefetches, scalar work); None where nothing measured
    stands for it. The family's unit multiply (vpdpbusd, or vpmaddubsw on avx2) is the unit itself."""
    mnemonic, memory = key.removesuffix(MEMORY), key.endswith(MEMORY)
    if mnemonic == family.unit_mnemonic:
        return family.unit_mnemonic
    if FMA.match(mnemonic):
        return family.fma
    if mnemonic in ("vpbroadcastd", "vbroadcastss", "vbroadcasti32x4", "vpbroadcastq", "vbroadcasti128"):
        if family.ymm:
            return "ymm-vpbroadcastd-load" if memory else "ymm-vpshufb"
        return "vpbroadcastd-load" if memory else "vpshufb"
    if MOVES.match(mnemonic):
        return family.weighed_as[mnemonic] if mnemonic in family.weighed_as and not memory else ""
    if not mnemonic.startswith("v") and not mnemonic.startswith("k"):
        return ""  # scalar: address arithmetic, loop control
    weight = family.weighed_as.get(mnemonic)
    if family.ymm and memory and mnemonic.startswith("vpmov") and weight:
        return weight + "-load"  # a widening load: cheaper than the widening from a register
    return weight


def slots(counts: dict[str, float], shares: dict[str, float],
          family: Family = FAMILIES["avx512-vnni"]) -> tuple[float, list[str]]:
    """A block's multiply slots (the unit multiply 1, the rest by their measured shares) and the mnemonics not
    weighed."""
    total, unweighed = 0.0, []
    for mnemonic, count in counts.items():
        key = weight_of(mnemonic, family)
        if key is None:
            unweighed.append(mnemonic)
        elif key == family.unit_mnemonic:
            total += count
        elif key:
            total += count * max(shares.get(key, 0.0), 0.0)
    return total, sorted(unweighed)


def verify_macs(path: str, parts: tuple[str, ...] = ("layers", "head")) -> dict[str, int]:
    """Multiply-adds a position costs in each quant type: every layer's matrices and the LM head (the embedding's
    table where the head is tied to it), or only the `parts` named."""
    reader = GGUFReader(path)
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    macs: dict[str, int] = {}
    for tensor in reader.tensors:
        if len(tensor.shape) == 2 and ((tensor.name.startswith("blk.") and "layers" in parts)
                                       or (tensor.name == head and "head" in parts)):
            qtype = tensor.tensor_type.name
            macs[qtype] = macs.get(qtype, 0) + int(tensor.n_elements)
    return macs


def measure_shares(rounds: int, pairs: int, family: Family = FAMILIES["avx512-vnni"]) -> tuple[float, dict[str, float]]:
    """The family's unit multiply's best rate a core (every core at once) and each companion's share of its slot,
    measured now (multiply_rate.best_of_pairs): the 512-bit companions beside zmm vpdpbusd, the 256-bit ones beside
    ymm vpmaddubsw."""
    companions = [c for c in multiply_rate.runnable_companions(multiply_rate.cpu_flags())
                  if multiply_rate.is_256(c) == family.ymm]
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        binary = multiply_rate.build_probe([family.unit], Path(tmp), companions)
        multiply_rate.rate_per_core(binary, family.unit, cores, rounds)  # warm-up
        shares, alone_rates = {}, []
        for companion in companions:
            alone, paired = multiply_rate.best_of_pairs(binary, family.unit, f"{family.unit}+{companion}", cores,
                                                        rounds, pairs)
            alone_rates += alone
            shares[companion] = multiply_rate.companion_share(statistics.median(alone), statistics.median(paired))
    return statistics.median(alone_rates), shares


def hot_matrix(path: str, qtype: str, most_bytes: int, layout: str = "r16") -> QuantMatrix | None:
    """The file's first layer matrix of `qtype` (cut to its first rows where it holds more than `most_bytes`; whole
    groups of 16), in `layout`: it stays in the last-level cache while it is multiplied again and again, and its
    calls are long enough that a call's own cost is a small part of them."""
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type.name == qtype and len(tensor.shape) == 2 and tensor.name.startswith("blk."):
            raw = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(tensor.data.shape[0], -1))
            cut = min(raw.shape[0], most_bytes // raw.shape[1]) // 16 * 16
            return QuantMatrix(raw[:cut].clone(), qtype, int(tensor.shape[0]), tensor.name).in_layout(layout)
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
    parser.add_argument("--logits", choices=("every", "one"), default="every",
                        help="the passes' logits: of every position (the head over m rows), or of the last only (the "
                             "head over one row, as bench/lean_step.py times T(m); a greedy verify pass's exact "
                             "argmax head reads about that whatever m is)")
    parser.add_argument("--rounds", type=int, default=10_000_000, help="the probe's rounds a measurement")
    parser.add_argument("--pairs", type=int, default=multiply_rate.PAIRS,
                        help="alone-then-paired runs each slot share is the best of")
    parser.add_argument("--out", default=None, help="CSV of the floors and times per m")
    args = parser.parse_args(argv)
    if min(args.repeats, args.rounds, args.pairs, *args.m) < 1:
        parser.error("--repeats, --rounds, --pairs and every --m must be at least 1")
    if 1 not in args.m:
        parser.error("--m must include 1: the floors are set against T(1)")
    torch.set_num_threads(args.threads)
    library = quant._quant.__file__
    parts = {"layers": verify_macs(args.gguf, ("layers",)), "head": verify_macs(args.gguf, ("head",))}
    unsupported = sorted({q for macs_of in parts.values() for q in macs_of} - set(COUNTED_TYPES))
    if unsupported:
        sys.exit(f"verify_roofline: counts Q4_K and Q6_K products; {args.gguf} also has {unsupported}")
    session = LeanLM(args.gguf)
    plan = session.model.plan
    family = family_for(plan.pass_kernel(2, prompt=False))
    # each part (the layers' matrices, the head) and type in the layout its verify passes run (the plan's second
    # copy where it keeps one: class "Q4_K", "Q6_K" or "head"); the 512-bit family counts the group functions, as
    # the AVX-512 kernels run them

    def layout(part: str, qtype: str) -> str:
        cls = "head" if part == "head" else qtype
        return (plan.verify_layouts.get(cls) or plan.layouts.get(cls) or quant.preferred_layout(qtype, 16)) \
            if family.kernel == "avx2" else "r16"

    counted = {(part, q): family.counted[q, layout(part, q)] for part, macs_of in parts.items() for q in macs_of}
    head_rows = (lambda m: m) if args.logits == "every" else (lambda m: 1)
    print(f"session: kernel plan ({plan.source}) {plan.label()}; counted: "
          + ", ".join(f"{part} {q} {c.name.format(n='N')}" for (part, q), c in counted.items()), flush=True)

    rate, shares = measure_shares(args.rounds, args.pairs, family)
    print(f"{family.unit}: {rate / 1e9:.2f} G a second a core ({len(os.sched_getaffinity(0))} cores at once); slot "
          "shares beside it: " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()), flush=True)
    per_block: dict[tuple[str, int], float] = {}  # (function name, inputs) -> slots a block
    for (part, qtype), c in counted.items():
        rows = {head_rows(m) if part == "head" else m for m in args.m}
        for n in sorted({n for m in rows for n in c.split_inputs(m)}):
            if (c.name, n) in per_block:
                continue
            counts = block_counts(c, n, library)
            per_block[c.name, n], unweighed = slots(counts, shares, family)
            weighed = {k: v for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
                       if (w := weight_of(k, family)) and (w == family.unit_mnemonic or shares.get(w, 0) > 0.05)}
            print(f"{c.name.format(n=n)}: {per_block[c.name, n]:.1f} slots a block of {c.rows} x "
                  f"{c.values} ({per_block[c.name, n] / n:.1f} an input; {c.expected_core(1)} would be "
                  f"one slot per {c.macs_per_core} multiply-adds): "
                  + ", ".join(f"{k} {v:g}" for k, v in weighed.items())
                  + (f"; not weighed: {unweighed}" if unweighed else ""), flush=True)

    config = GGUFReader(args.gguf)
    arch = str(bytes(config.fields["general.architecture"].parts[-1]), "utf-8")
    n_head = int(config.fields[f"{arch}.attention.head_count"].parts[-1][0])
    n_layer = int(config.fields[f"{arch}.block_count"].parts[-1][0])
    n_embd = int(config.fields[f"{arch}.embedding_length"].parts[-1][0])
    head_dim = n_embd // n_head

    def multiply_floor(m: int) -> float:
        slots_total = 0.0
        for (part, q), c in counted.items():
            rows = head_rows(m) if part == "head" else m
            slots_total += parts[part][q] / (c.rows * c.values) * sum(per_block[c.name, n]
                                                                             for n in c.split_inputs(rows))
        return slots_total / (rate * args.threads)

    def attention_floor(m: int) -> float:
        # q.k and p.v over the context and the pass's own positions: 8-wide fp32 FMAs. Beside zmm vpdpbusd half a
        # 512-bit FMA's measured slot each (a CPU whose 512-bit multiply slot is two 256-bit halves, the Zen 4; an
        # upper estimate elsewhere); beside ymm vpmaddubsw the 8-wide FMA's own measured share
        fmas = sum(2 * n_head * head_dim * (args.context + i + 1) for i in range(m)) * n_layer
        return fmas / 8 * family.fma_factor * shares.get(family.fma, 1.0) / (rate * args.threads)

    # The products alone, in cache: how near their kernels run to the slots counted above
    hot_rows = []
    for (part, qtype), c in counted.items():
        if part != "layers":
            continue
        matrix = hot_matrix(args.gguf, qtype, HOT_BYTES, layout(part, qtype))
        if matrix is None:
            continue
        seconds = time_hot(matrix, args.m, args.repeats, family.kernel)
        blocks = matrix.out_features // c.rows * (matrix.in_features // c.values)
        for m in args.m:
            floor = blocks * sum(per_block[c.name, n] for n in c.split_inputs(m)) / (rate * args.threads)
            hot_rows.append({"qtype": qtype, "m": m, "seconds": seconds[m], "slots_floor_s": floor})
        print(f"{qtype} {matrix.name} {matrix.out_features}x{matrix.in_features} in cache: " + ", ".join(
            f"m{r['m']} {r['seconds'] * 1e6:.0f} us ({r['seconds'] / r['slots_floor_s']:.2f}x its slots)"
            for r in hot_rows if r["qtype"] == qtype), flush=True)

    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, session.vocab_size, (args.context,), generator=generator).tolist()
    tokens = torch.randint(0, session.vocab_size, (max(args.m),), generator=generator).tolist()
    session.extend(context, 1)
    times = {m: [] for m in args.m}
    bandwidths = []
    for repeat in range(args.repeats + 1):  # the first round warms up
        for m in args.m[repeat % len(args.m):] + args.m[:repeat % len(args.m)]:
            start = time.perf_counter()
            session.extend(tokens[:m], m if args.logits == "every" else 1)
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
                     "unit": family.unit, "unit_per_s": rate, "logits": args.logits, "repeats": args.repeats})
        print(f"m {m}: {median * 1e3:6.1f} ms [{min(times[m]) * 1e3:.1f}, {max(times[m]) * 1e3:.1f}]  bytes floor "
              f"{bytes_floor * 1e3:5.1f} ms  multiplier floor {products * 1e3:5.1f} + attention {attention * 1e3:4.1f} "
              f"ms  T(m)/T(1) {median / one:.2f}, the floors allow {bound / one:.2f}; the pass "
              f"{median / (products + attention):.2f}x its multiplier floor", flush=True)
    if args.out:
        write_csv(pd.DataFrame(rows), args.out)
        write_csv(pd.DataFrame(hot_rows), str(Path(args.out).with_suffix("")) + ".in_cache.csv")


if __name__ == "__main__":
    main()
