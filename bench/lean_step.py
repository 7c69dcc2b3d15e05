"""Time the lean GGUF forward: a one-token step and passes over m positions after a cached context, against the
bandwidth floor (the bytes a step reads / the machine's read bandwidth, measured in the same process).

    python bench/lean_step.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--m 1 2 3 5 9 16]
                              [--kernels avx2 avx512-vnni]

Passes are interleaved per repeat (each crops back to the context first), and so are the product kernels (every one
this CPU runs, unless named; they give the same bits); medians and the spread over repeats. Run it alone on the
machine."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec import quant
from specdec.lean import LeanLM
from specdec.study.profiling import memory_bandwidth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--m", nargs="+", type=int, default=[1, 2, 3, 5, 9, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=None, help="run only the first N layers (a truncated draft)")
    parser.add_argument("--kernels", nargs="+", default=None, help="product kernels to time (default: all this CPU runs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    session = LeanLM(args.gguf, layers=args.layers)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, session.vocab_size, (args.context,), generator=generator).tolist()
    tokens = torch.randint(0, session.vocab_size, (max(args.m),), generator=generator).tolist()
    session.extend(context, 1)
    kernels = args.kernels or list(quant.kernels())
    cells = [(kernel, m) for kernel in kernels for m in args.m]
    times = {cell: [] for cell in cells}
    for kernel, m in cells:  # warm-up
        with quant.use_kernel(kernel):
            session.extend(tokens[:m], 1)
        session.crop(args.context)
    for repeat in range(args.repeats):
        for kernel, m in cells[repeat % len(cells):] + cells[:repeat % len(cells)]:
            with quant.use_kernel(kernel):
                start = time.perf_counter()
                session.extend(tokens[:m], 1)
                times[kernel, m].append(time.perf_counter() - start)
            session.crop(args.context)
    bandwidth = memory_bandwidth(1024 * 2**20, repeats=5)
    floor = session.step_bytes() / bandwidth
    print(f"{args.gguf}: {session.step_bytes() / 1e9:.3f} GB per step, read bandwidth {bandwidth / 1e9:.1f} GB/s, "
          f"floor {floor * 1e3:.1f} ms, {args.threads} threads, context {args.context}")
    for (kernel, m), t in times.items():
        median, one = statistics.median(t), statistics.median(times[kernel, min(args.m)])
        print(f"{kernel:12s} m {m:2d}: {median * 1e3:7.1f} ms [{min(t) * 1e3:.1f}, {max(t) * 1e3:.1f}]  "
              f"x{median / floor:.2f} floor  T(m)/T(1) {median / one:.2f}")


if __name__ == "__main__":
    main()
