"""A bf16 draft's forward by bf16 backend: torch's bf16 product ("bf16") against the AVX2 kernel reading the bf16
weights ("avx2-bf16"), and both against the fp32 copy of the same values ("fp32-copy", what RowAdaptiveBf16Linear
uses beyond its backend's BF16_MAX_ROWS) and the per-row choice the engine measures when it loads ("tuned",
tune_row_adaptive_bf16), over m new positions after a 256-token cache, interleaved in one process,
medians, next to the bandwidth floor of the draft's bf16 bytes (the roofline stage's loop,
specdec/study/cost/roofline.py). m = 1, 2 is a draft step; m of 9-64 is a hybrid draft's catch-up over prompt and
generated tokens, which sets BF16_MAX_ROWS. Run it alone on the machine (docs/performance.md, "A bf16 draft").

    python bench/bf16_draft_step.py --draft resources/models/qwen2.5-coder-0.5b-instruct --repeats 9
    python bench/bf16_draft_step.py --positions 8 9 16 24 32 40 48 64 --repeats 5
"""

import argparse

import torch

from specdec.fp32.kernels import (
    RowAdaptiveBf16Linear,
    available_bf16_backends,
    tune_row_adaptive_bf16,
    use_row_adaptive_bf16_linear,
)
from specdec.fp32.kernel_tables import backend_spans
from specdec.fp32.loading import load_model
from specdec.study.cost.profiling import memory_bandwidth
from specdec.study.cost.roofline import kernel_roofline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", default="resources/models/qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--positions", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.draft, dtype="bfloat16")
    candidates = {backend: lambda m, backend=backend: use_row_adaptive_bf16_linear(m, max_bf16_rows=10**9,
                                                                                    default=backend)
                  for backend in available_bf16_backends()}
    candidates["fp32-copy"] = lambda m: use_row_adaptive_bf16_linear(m, max_bf16_rows=0)

    measured = {}

    def tuned(m):  # what the engine loads with runtime.linear_kernel "auto": per shape and row count, measured once
        use_row_adaptive_bf16_linear(m)
        if not measured:
            measured.update(tune_row_adaptive_bf16(m))
            print("tuned:", {shape: backend_spans({shape: {r: n for r, n in t.items() if r != "beyond"}})[shape]
                             | {"beyond": t["beyond"]} for shape, t in measured.items()})
        for layer in m.modules():
            if isinstance(layer, RowAdaptiveBf16Linear):
                table = measured[f"{layer.out_features}x{layer.in_features}"]
                layer.set_table({r: n for r, n in table.items() if r != "beyond"}, table["beyond"])
        return m

    candidates["tuned"] = tuned
    table = kernel_roofline(model, memory_bandwidth(), candidates, positions=args.positions, repeats=args.repeats,
                            context_length=args.context)
    print(table[["candidate", "m", "seconds", "over_floor", "over_m1"]].round(4).to_string(index=False))


if __name__ == "__main__":
    main()
