"""The lean GGUF forward's cost per decoder layer, with the fused layers and with the Python forward, and where it
puts this regime on the seed's depth-vs-bytes line.

    python bench/layer_overhead.py [--gguf TARGET.gguf DRAFT.gguf] [--fractions 0.15 0.35 0.55 0.75 1.0]

For each file and forward, one-token steps of sessions that run the first n layers (then the final norm and head),
n over the fractions of the file's layer count, all interleaved repeat by repeat in one process after a cached
context. Per (file, forward): least squares of the step time on n gives one layer's time. Across the files (layers of
different widths), per forward: least squares of a layer's time on its bytes, t = a + b x bytes, as the cost model's
machine fit does for fp32 (docs/costmodel.md): a is the per-layer overhead that does not scale with the weights, and
s = layers x a / step is its share of the first file's step (depth sets a draft's cost only where s > 1/2).
Intervals: a bootstrap over repeats. Run it alone on the machine."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from specdec.gguf.model import read_gguf
from specdec.gguf.lean import LeanLM
from specdec.study.cost.profiling import memory_bandwidth

FORWARDS = {"fused": True, "python": False}


def layer_time(layers: list[int], times: np.ndarray) -> float:
    """Slope of the per-cell medians on the layer count (times: repeats x cells)."""
    return float(np.polyfit(layers, np.median(times, axis=0), 1)[0])


def line(x: list[float], y: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line."""
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", nargs="+", default=["resources/gguf/qwen2.5-coder-1.5b-instruct.gguf",
                                                       "resources/gguf/qwen2.5-coder-0.5b-instruct.gguf"])
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.15, 0.35, 0.55, 0.75, 1.0])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-boot", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {path: read_gguf(path) for path in args.gguf}
    counts = {path: sorted({max(1, round(f * m.config.layers)) for f in args.fractions}) for path, m in models.items()}
    sessions = {(path, f, n): LeanLM(model, layers=n, max_length=args.context + 8, fused=fused)
                for path, model in models.items() for f, fused in FORWARDS.items() for n in counts[path]}
    generator = torch.Generator().manual_seed(0)
    for (path, _, _), session in sessions.items():
        context = torch.randint(0, models[path].config.vocab_size, (args.context,), generator=generator).tolist()
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
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s, {args.threads} threads, {args.repeats} repeats, "
          f"context {args.context}")
    layer_bytes = {path: (m.step_bytes(m.config.layers) - m.step_bytes(0)) / m.config.layers
                   for path, m in models.items()}
    tables = {(path, f): np.array([times[(path, f, n)] for n in counts[path]]).T
              for path in models for f in FORWARDS}
    rng = np.random.default_rng(0)
    target = args.gguf[0]
    for f in FORWARDS:
        print(f"\n{f} forward")
        per_layer = {}
        for path in models:
            table = tables[(path, f)]
            per_layer[path] = layer_time(counts[path], table)
            cells = "  ".join(f"{n}: {np.median(table[:, i]) * 1e3:.1f}" for i, n in enumerate(counts[path]))
            print(f"  {path}: step ms by layers {cells}; a layer {per_layer[path] * 1e3:.3f} ms for "
                  f"{layer_bytes[path] / 1e6:.1f} MB (reading it: {layer_bytes[path] / bandwidth * 1e3:.2f} ms)")
        if len(models) < 2:
            continue
        boot = []
        for _ in range(args.n_boot):
            resampled = {path: layer_time(counts[path], t[rng.integers(0, len(t), len(t))])
                         for (path, g), t in tables.items() if g == f}
            boot.append(line([layer_bytes[p] for p in models], [resampled[p] for p in models]))
        a, b = line([layer_bytes[p] for p in models], [per_layer[p] for p in models])
        (a_lo, b_lo), (a_hi, b_hi) = np.percentile(boot, 2.5, axis=0), np.percentile(boot, 97.5, axis=0)
        step = float(np.median(tables[(target, f)][:, -1]))
        layers = models[target].config.layers
        share = layers * a / step
        s_lo, s_hi = layers * a_lo / step, layers * a_hi / step
        print(f"  a layer = a + b x bytes: a {a * 1e3:.3f} ms [{a_lo * 1e3:.3f}, {a_hi * 1e3:.3f}], 1/b "
              f"{1 / b / 1e9:.1f} GB/s [{1 / b_hi / 1e9:.1f}, {1 / b_lo / 1e9:.1f}]; {target}'s step "
              f"{step * 1e3:.1f} ms, s = {layers} x a / step = {share:.2f} [{s_lo:.2f}, {s_hi:.2f}]")


if __name__ == "__main__":
    main()
