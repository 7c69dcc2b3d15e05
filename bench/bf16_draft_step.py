"""A bf16 draft's step by bf16 backend: torch's bf16 product ("bf16") against the AVX2 kernel reading the bf16
weights ("avx2-bf16"), the whole forward over m = 1 and 2 new positions over a 256-token cache, interleaved in one
process, medians, next to the bandwidth floor of the draft's bf16 bytes (the roofline stage's loop,
specdec/study/roofline.py). Run it alone on the machine (docs/performance.md, "A bf16 draft").

    python bench/bf16_draft_step.py --draft resources/models/qwen2.5-coder-0.5b-instruct --repeats 9
"""

import argparse

import torch

from specdec.kernels import available_bf16_backends, use_row_adaptive_bf16_linear
from specdec.loading import load_model
from specdec.study.profiling import memory_bandwidth
from specdec.study.roofline import kernel_roofline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", default="resources/models/qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.draft, dtype="bfloat16")
    candidates = {backend: lambda m, backend=backend: use_row_adaptive_bf16_linear(m, default=backend)
                  for backend in available_bf16_backends()}
    table = kernel_roofline(model, memory_bandwidth(), candidates, positions=[1, 2], repeats=args.repeats,
                            context_length=args.context)
    print(table[["candidate", "m", "seconds", "over_floor", "over_m1"]].round(4).to_string(index=False))


if __name__ == "__main__":
    main()
