"""How close a target step and a verify pass come to the memory-bandwidth floor, per linear-backend choice.

One batch-1 forward over m new positions reads every layer's weights and the LM head once: with B the bytes of
those weights and W the machine's read bandwidth, B / W is the floor of a step whatever the kernel. This measures,
in one process and interleaved, the whole forward for m = 1 .. 9 over a KV cache of `context_length` tokens with
each candidate backend (the same weights, swapped in place), and reports T(1) / floor and T(m) / T(1).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping, Sequence

import pandas as pd
import torch
from transformers import DynamicCache

from specdec.fp32.kernels import restore_linears, use_backends

ROOFLINE_COLUMNS = ["candidate", "m", "seconds", "floor_seconds", "over_floor", "over_m1", "bandwidth_gb_s",
                    "weight_bytes", "repeats"]


def step_weight_bytes(model) -> int:
    """Bytes of the decoder layers' and the LM head's parameters: what one forward has to read."""
    layers = sum(p.numel() * p.element_size() for p in model.model.layers.parameters())
    head = model.get_output_embeddings().weight
    return layers + head.numel() * head.element_size()


@torch.inference_mode()
def kernel_roofline(model, bandwidth: float,
                    candidates: Mapping[str, Mapping[str, Mapping[int, str]] | str | Callable[[object], object]],
                    positions: Sequence[int] = tuple(range(1, 10)), repeats: int = 5, context_length: int = 256,
                    log: Callable[[str], None] = print) -> pd.DataFrame:
    """candidates: name -> a backend name for every product ("linear", "weight_major", "avx2"), per-shape tables
    (kernel_tables.fastest_backends), or a function that swaps its layers into the model (e.g. a bf16 draft's, with
    kernels.use_row_adaptive_bf16_linear). The model must hold plain nn.Linear layers (loaded with kernel
    "default"); each candidate is swapped in for its turn and out again."""
    ids = torch.randint(0, model.config.vocab_size, (1, context_length + max(positions)),
                        generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context_length], cache=cache, use_cache=True, logits_to_keep=1)

    def forward(m: int) -> float:
        start = time.perf_counter()
        model(input_ids=ids[:, context_length:context_length + m], cache=cache, use_cache=True, logits_to_keep=m)
        seconds = time.perf_counter() - start
        cache.crop(-m)
        return seconds

    times = {(name, m): [] for name in candidates for m in positions}
    names = list(candidates)
    for repeat in range(repeats + 1):  # the first round warms every candidate up and is not recorded
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            choice = candidates[name]
            if callable(choice):
                choice(model)
            else:
                use_backends(model, choice if isinstance(choice, str) else "linear",
                             None if isinstance(choice, str) else choice)
            for m in positions:
                seconds = forward(m)
                if repeat:
                    times[(name, m)].append(seconds)
            restore_linears(model)
        if repeat:
            log(f"repeat {repeat}/{repeats}: " + ", ".join(
                f"{name} T(1) {statistics.median(times[(name, positions[0])]) * 1e3:.0f} ms" for name in names))
    weight_bytes = step_weight_bytes(model)
    floor = weight_bytes / bandwidth
    rows = []
    for name in names:
        t1 = statistics.median(times[(name, 1)]) if 1 in positions else float("nan")
        for m in positions:
            seconds = statistics.median(times[(name, m)])
            rows.append({"candidate": name, "m": m, "seconds": seconds, "floor_seconds": floor,
                         "over_floor": seconds / floor, "over_m1": seconds / t1, "bandwidth_gb_s": bandwidth / 1e9,
                         "weight_bytes": weight_bytes, "repeats": repeats})
    return pd.DataFrame(rows, columns=ROOFLINE_COLUMNS)
