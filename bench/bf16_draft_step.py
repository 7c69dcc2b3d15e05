"""A bf16 draft's step by bf16 backend: torch's bf16 product ("bf16") against the AVX2 kernel reading the bf16
weights ("avx2-bf16"), the whole forward over m = 1 and 2 new positions over a 256-token cache, interleaved in one
process, medians. Run it alone on the machine (docs/performance.md, "A bf16 draft").

    python bench/bf16_draft_step.py --draft resources/models/qwen2.5-coder-0.5b-instruct --repeats 9
"""

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from specdec.kernels import BF16_BACKENDS, available_backends, restore_linears, use_row_adaptive_bf16_linear
from specdec.loading import load_model


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", default="resources/models/qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backends = [b for b in BF16_BACKENDS if b == "bf16" or "avx2" in available_backends()]
    model, _ = load_model(args.draft, dtype="bfloat16")
    ids = torch.randint(0, model.config.vocab_size, (1, args.context + 2), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :args.context], cache=cache, use_cache=True, logits_to_keep=1)
    seconds: dict[tuple[str, int], list[float]] = {}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not kept
        for backend in backends[repeat % len(backends):] + backends[:repeat % len(backends)]:
            use_row_adaptive_bf16_linear(model, default=backend)
            for m in (1, 2):
                start = time.perf_counter()
                model(input_ids=ids[:, args.context:args.context + m], cache=cache, use_cache=True, logits_to_keep=m)
                elapsed = time.perf_counter() - start
                cache.crop(-m)
                if repeat:
                    seconds.setdefault((backend, m), []).append(elapsed)
            restore_linears(model)
    for (backend, m), times in sorted(seconds.items()):
        print(f"{backend:10s} m={m}: median {statistics.median(times) * 1e3:.1f} ms "
              f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}, {len(times)} repeats)")


if __name__ == "__main__":
    main()
