"""Time the quantized product (specdec/_quant.c) on the target's weight shapes against the bandwidth floor.

    python bench/quant_kernel.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--rows 1 2 4 9 16]
        [--kernels avx512-vnni amx]

Every layer's matrix of one shape is used in turn (so none stays in cache), rows counts and kernels (all this CPU
runs, by default) interleaved per repeat; prints ms per product (median over repeats) and GB/s of weight bytes, and
each row count's time over one row's on the same kernel. Run it alone on the machine."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gguf import GGUFReader

from specdec import quant
from specdec.quant import QuantMatrix


def matrices(path: str, kind: str) -> list[QuantMatrix]:
    out = []
    for tensor in GGUFReader(path).tensors:
        if tensor.name in (f"{kind}.weight",) or tensor.name.endswith(f".{kind}.weight"):
            raw = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(tensor.data.shape[0], -1))
            out.append(QuantMatrix(raw, tensor.tensor_type.name, int(tensor.shape[0]), tensor.name))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--kinds", nargs="+", default=["ffn_up", "ffn_down", "attn_q", "output"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 9, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", nargs="+", default=None, help="product kernels (default: every one this CPU runs)")
    args = parser.parse_args()
    kernels = args.kernels or list(quant.kernels())
    torch.set_num_threads(args.threads)
    for kind in args.kinds:
        group = matrices(args.gguf, kind)
        inputs = {m: torch.randn(m, group[0].in_features) for m in args.rows}
        cells = [(kernel, m) for kernel in kernels for m in args.rows]
        times = {cell: [] for cell in cells}
        for w in group:
            w.matmul(inputs[1])  # first touch
        for repeat in range(args.repeats):
            for kernel, m in cells[repeat % len(cells):] + cells[:repeat % len(cells)]:
                with quant.use_kernel(kernel):
                    for w in group:
                        start = time.perf_counter()
                        w.matmul(inputs[m])
                        times[kernel, m].append(time.perf_counter() - start)
        types = sorted({w.qtype for w in group})
        nbytes = statistics.mean(w.nbytes for w in group)
        for kernel in kernels:
            one = statistics.median(times[kernel, args.rows[0]])
            line = ", ".join(f"m{m} {statistics.median(times[kernel, m]) * 1e3:.3f} ms "
                             f"({nbytes / statistics.median(times[kernel, m]) / 1e9:.1f} GB/s, "
                             f"x{statistics.median(times[kernel, m]) / one:.2f})" for m in args.rows)
            print(f"{kind} {group[0].out_features}x{group[0].in_features} {'/'.join(types)} x{len(group)} {kernel}: "
                  f"{line}", flush=True)


if __name__ == "__main__":
    main()
