"""Time the quantized product (specdec/native/_quant.c) on the target's weight shapes against the bandwidth floor.

    python bench/quant_kernel.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--rows 1 2 4 9 16]
        [--kernels avx512-vnni amx] [--layouts rows r16] [--types Q4_K]

Every layer's matrix of one shape (of the --types asked for) is used in turn (so none stays in cache), rows counts,
kernels (all this CPU runs, by default) and layouts (the file's rows, and Q4_K/Q6_K in groups of 16 rows on the
AVX-512 kernels) interleaved per repeat; prints ms per product (median over repeats) and GB/s of weight bytes as
held, and each row count's time over one row's in the same cell. --hot-rows N times the arithmetic alone instead
(one matrix's first N rows, in cache), in multiply-adds per second a core. Run it alone on the machine."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gguf import GGUFReader

from specdec.gguf import quant
from specdec.gguf.quant import QuantMatrix


def matrices(path: str, kind: str, types=None) -> list[QuantMatrix]:
    out = []
    for tensor in GGUFReader(path).tensors:
        if tensor.name in (f"{kind}.weight",) or tensor.name.endswith(f".{kind}.weight"):
            raw = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(tensor.data.shape[0], -1))
            out.append(QuantMatrix(raw, tensor.tensor_type.name, int(tensor.shape[0]), tensor.name))
    if types:
        out = [m for m in out if m.qtype in types]
    return out


def cell_text(seconds: float, one: float, nbytes: float, macs_a_thread: float, m: int, hot: bool) -> str:
    """One row count's time, bytes per second, its ratio to one row's time and, for the arithmetic alone, its
    multiply-adds per second a core."""
    rate = f", {macs_a_thread / seconds / 1e9:.0f} G multiply-adds/s a core" if hot else ""
    return f"m{m} {seconds * 1e3:.3f} ms ({nbytes / seconds / 1e9:.1f} GB/s, x{seconds / one:.2f}{rate})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--kinds", nargs="+", default=["ffn_up", "ffn_down", "attn_q", "output"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 9, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", nargs="+", default=None, help="product kernels (default: every one this CPU runs)")
    parser.add_argument("--layouts", nargs="+", default=list(quant.LAYOUTS), choices=quant.LAYOUTS)
    parser.add_argument("--types", nargs="+", default=None, help="only matrices of these types (default: all)")
    parser.add_argument("--hot-rows", type=int, default=None,
                        help="the arithmetic alone: each kind's first matrix cut to its first N rows (whole groups of "
                             "16), multiplied 28 times in a row so that its weights stay in cache; adds multiply-adds "
                             "per second a core, to set against bench/multiply_rate.py's ceiling")
    args = parser.parse_args()
    kernels = args.kernels or list(quant.kernels())
    torch.set_num_threads(args.threads)
    for kind in args.kinds:
        group = matrices(args.gguf, kind, args.types)
        if not group:
            continue
        if args.hot_rows:
            first = group[0]
            if args.hot_rows % quant.R16_ROWS or not 0 < args.hot_rows <= first.out_features:
                parser.error(f"--hot-rows {args.hot_rows}: a multiple of {quant.R16_ROWS} up to {kind}'s "
                             f"{first.out_features} rows")
            group = [QuantMatrix(first.raw[:args.hot_rows].clone(), first.qtype, first.in_features, first.name)]
        layouts = {"rows": group}
        if "r16" in args.layouts and all(m.qtype in quant.R16_BLOCK_BYTES and m.out_features % quant.R16_ROWS == 0
                                         for m in group):
            layouts["r16"] = [m.in_layout("r16") for m in group]
        if "rows" not in args.layouts:
            del layouts["rows"]
        if args.hot_rows:  # one copy per layout, multiplied 28 times in a row
            layouts = {lay: ws * 28 for lay, ws in layouts.items()}
        inputs = {m: torch.randn(m, group[0].in_features) for m in args.rows}
        variants = [(k, lay) for lay in layouts for k in kernels]
        cells = [(k, lay, m) for k, lay in variants for m in args.rows]
        times = {cell: [] for cell in cells}
        for lay, ws in layouts.items():
            for w in ws:
                w.matmul(inputs[1])  # first touch
        for repeat in range(args.repeats):
            for kernel, lay, m in cells[repeat % len(cells):] + cells[:repeat % len(cells)]:
                with quant.use_kernel(kernel):
                    for w in layouts[lay]:
                        start = time.perf_counter()
                        w.matmul(inputs[m])
                        times[kernel, lay, m].append(time.perf_counter() - start)
        types = sorted({w.qtype for w in group})
        for kernel, lay in variants:
            nbytes = statistics.mean(w.nbytes for w in layouts[lay])
            one = statistics.median(times[kernel, lay, args.rows[0]])
            line = ", ".join(cell_text(statistics.median(times[kernel, lay, m]), one, nbytes,
                                       group[0].out_features * group[0].in_features * m / args.threads, m,
                                       args.hot_rows is not None) for m in args.rows)
            print(f"{kind} {group[0].out_features}x{group[0].in_features} {'/'.join(types)} "
                  f"{'one, in cache, x28' if args.hot_rows else f'x{len(group)}'} {kernel} "
                  f"{lay}: {line}", flush=True)

if __name__ == "__main__":
    main()
