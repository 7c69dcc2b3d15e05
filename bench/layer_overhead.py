"""The lean GGUF forward's fixed cost per decoder layer, with the fused layers and with the Python forward.

    python bench/layer_overhead.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--layers 4 10 16 22 28]

A one-token step of sessions that run the first n layers (then the final norm and head), n over --layers, for both
forwards, interleaved repeat by repeat in one process after a cached context. Per forward, least squares of the step
time on n: the slope is one layer's time; minus the layer's bytes over the read bandwidth (measured in the same
process) it is the per-layer overhead: what a layer costs beyond reading its weights. Medians per cell, a bootstrap
over repeats for the intervals. Run it alone on the machine."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from specdec.gguf_model import read_gguf
from specdec.lean import LeanLM
from specdec.study.profiling import memory_bandwidth


def fit(layers: list[int], times: np.ndarray) -> tuple[float, float]:
    """Slope and intercept of the per-cell medians on the layer count (times: repeats x cells)."""
    slope, intercept = np.polyfit(layers, np.median(times, axis=0), 1)
    return slope, intercept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--layers", nargs="+", type=int, default=[4, 10, 16, 22, 28])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-boot", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = read_gguf(args.gguf)
    layers = [n for n in args.layers if n <= model.config.layers]
    forwards = {"fused": True, "python": False}
    sessions = {(f, n): LeanLM(model, layers=n, max_length=args.context + 8, fused=fused)
                for f, fused in forwards.items() for n in layers}
    context = torch.randint(0, model.config.vocab_size, (args.context,),
                            generator=torch.Generator().manual_seed(0)).tolist()
    for session in sessions.values():
        session.extend(context, 1)
        session.extend([7], 1)  # warm-up
        session.crop(args.context)
    keys = list(sessions)
    times = {key: [] for key in keys}
    for repeat in range(args.repeats):
        for key in keys[repeat % len(keys):] + keys[:repeat % len(keys)]:
            start = time.perf_counter()
            sessions[key].extend([7], 1)
            times[key].append(time.perf_counter() - start)
            sessions[key].crop(args.context)
    bandwidth = memory_bandwidth(1024 * 2**20, repeats=5)
    layer_bytes = (model.step_bytes(model.config.layers) - model.step_bytes(0)) / model.config.layers
    read = layer_bytes / bandwidth
    print(f"{args.gguf}: {model.config.layers} layers of {layer_bytes / 1e6:.1f} MB, read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s (a layer's read {read * 1e3:.2f} ms), {args.threads} threads, "
          f"{args.repeats} repeats")
    rng = np.random.default_rng(0)
    for f in forwards:
        table = np.array([times[(f, n)] for n in layers]).T  # repeats x cells
        slope, intercept = fit(layers, table)
        boot = [fit(layers, table[rng.integers(0, len(table), len(table))])[0] for _ in range(args.n_boot)]
        lo, hi = np.percentile(boot, [2.5, 97.5])
        cells = "  ".join(f"{n}: {np.median(table[:, i]) * 1e3:.1f}" for i, n in enumerate(layers))
        print(f"{f:6s} step ms by layers {cells}")
        print(f"{f:6s} per layer {slope * 1e3:.3f} ms [{lo * 1e3:.3f}, {hi * 1e3:.3f}], overhead per layer "
              f"{(slope - read) * 1e3:.3f} ms [{(lo - read) * 1e3:.3f}, {(hi - read) * 1e3:.3f}] "
              f"({(slope - read) / slope:.0%} of a layer), fixed (head, norm, embedding) {intercept * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
