"""Time the lean GGUF forward: a one-token step and passes over m positions after a cached context, against the
bandwidth floor (the bytes a step reads / the machine's read bandwidth, measured in the same process).

    python bench/lean_step.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--m 1 2 3 5 9 16]
                              [--kernels avx2 avx512-vnni] [--head-vocab 65536]

Passes are interleaved per repeat (each crops back to the context first), and so are the product kernels (every one
this CPU runs, unless named; they give the same bits) on the file's row layout, and the layout a model loads with by
default where that is another (Q4_K in groups of 16 rows on AVX-512, `quant.preferred_layout`; one more copy of the
model in memory), and the file's kernel plan where it differs from that default (specdec/gguf/kernel_plan.py:
measured at this load, or this machine's cached plan); medians and the spread over repeats. Run it alone. Each
kernel named runs every pass here (forced), so a plan's own kernels per pass (a step's, a verify pass's) are timed
by bench/verify_roofline.py, which runs the session as it loads.

The floor is read once a round, right after its passes, and each pass is set against its own round's floor: on a
shared host the read bandwidth moved between 26 and 52 GB/s within half an hour (AMD EPYC Zen 4,
experiments/cpu-lead, sixth run), so one reading for the whole run made the same step 1.12x or 1.79x its floor."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from specdec.gguf import kernel_plan, quant
from specdec.gguf.lean import LeanLM
from specdec.study.cost.profiling import memory_bandwidth


BANDWIDTH_BYTES = 1024 * 2**20  # a torch sum over 1 GiB, far past the caches


def floor_ratios(seconds: list[float], step_bytes: int, bandwidths: list[float]) -> list[float]:
    """Each round's pass time over that round's floor (step_bytes at the bandwidth read right after the round)."""
    if len(seconds) != len(bandwidths):
        raise ValueError(f"{len(seconds)} pass times against {len(bandwidths)} bandwidth readings: one a round")
    return [t * bandwidth / step_bytes for t, bandwidth in zip(seconds, bandwidths)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--m", nargs="+", type=int, default=[1, 2, 3, 5, 9, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=None, help="run only the first N layers (a truncated draft)")
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="product kernels to time (default: all this CPU runs)")
    parser.add_argument("--head-vocab", type=int, default=None,
                        help="also time the sessions with their head limited to the first N ids (a draft's vocab)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1 (timed rounds after the warm-up), got {args.repeats}")
    torch.set_num_threads(args.threads)
    os.environ[kernel_plan.PLAN_ENV] = "off"
    os.environ[quant.LAYOUT_ENV] = "rows"
    sessions = {"rows": LeanLM(args.gguf, layers=args.layers)}
    os.environ[quant.LAYOUT_ENV] = "auto"
    default_kernel = quant.kernel_name()
    if quant.kernel_label() != default_kernel:  # models load in another layout here: that one too
        sessions["grouped"] = LeanLM(args.gguf, layers=args.layers)
    os.environ[kernel_plan.PLAN_ENV] = "auto"
    planned = LeanLM(args.gguf, layers=args.layers)  # the kernel plan (measured now, or this machine's cached one)
    plan = planned.model.plan
    if plan.source != "default":
        print(f"kernel plan ({plan.source}): {plan.label()}", flush=True)
        sessions["planned"] = planned
    if args.head_vocab:
        for layout, session in list(sessions.items()):
            limited = sessions[f"{layout}-v{args.head_vocab}"] = LeanLM(session.model, layers=args.layers)
            limited.limit_head_vocab(args.head_vocab)
    generator = torch.Generator().manual_seed(0)
    vocab = sessions["rows"].vocab_size
    context = torch.randint(0, vocab, (args.context,), generator=generator).tolist()
    tokens = torch.randint(0, vocab, (max(args.m),), generator=generator).tolist()
    for session in sessions.values():
        session.extend(context, 1)
    kernels = args.kernels or list(quant.kernels())
    variants = [(kernel, "rows") for kernel in kernels] + [
        (plan.kernel if layout.startswith("planned") else default_kernel, layout) for layout in sessions
        if layout != "rows"]
    cells = [(variant, m) for variant in variants for m in args.m]
    times = {cell: [] for cell in cells}
    bandwidths = []  # one reading a timed round
    for repeat in range(args.repeats + 1):  # the first round warms up
        for ((kernel, layout), m) in cells[repeat % len(cells):] + cells[:repeat % len(cells)]:
            session = sessions[layout]
            with quant.use_kernel(kernel):
                start = time.perf_counter()
                session.extend(tokens[:m], 1)
                if repeat:
                    times[(kernel, layout), m].append(time.perf_counter() - start)
            session.crop(args.context)
        if repeat:
            bandwidths.append(memory_bandwidth(BANDWIDTH_BYTES, repeats=3))
    bandwidth = statistics.median(bandwidths)
    print(f"{args.gguf}: read bandwidth {bandwidth / 1e9:.1f} GB/s [{min(bandwidths) / 1e9:.1f}, "
          f"{max(bandwidths) / 1e9:.1f}] over the rounds, {args.threads} threads, context {args.context}")
    for layout, session in sessions.items():
        print(f"  layout {layout}: {session.step_bytes() / 1e9:.3f} GB per step, floor "
              f"{session.step_bytes() / bandwidth * 1e3:.1f} ms at the median bandwidth")
    for ((kernel, layout), m), t in times.items():
        ratios = floor_ratios(t, sessions[layout].step_bytes(), bandwidths)
        median, one = statistics.median(t), statistics.median(times[(kernel, layout), min(args.m)])
        print(f"{kernel:12s} {layout:8s} m {m:2d}: {median * 1e3:7.1f} ms [{min(t) * 1e3:.1f}, {max(t) * 1e3:.1f}]  "
              f"x{statistics.median(ratios):.2f} floor [{min(ratios):.2f}, {max(ratios):.2f}]  "
              f"T(m)/T(1) {median / one:.2f}")


if __name__ == "__main__":
    main()
