"""Explain a greedy divergence: was it a floating-point near-tie or a bug?

A verify pass computes k+1 positions in one matrix product, a baseline step computes one; on CPU the two round
differently in the last bits. Where the baseline's top-2 logits are closer than that rounding difference, the two
paths may pick different tokens with both correct to float precision. We rerun both decodings with every target
logit recorded and compare the two paths at the first differing position.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.decode import generate_baseline, generate_speculative
from specdec.lm import CachedLM
from specdec.study.verify.divergence import first_difference


class RecordingLM(CachedLM):
    """A CachedLM that keeps the last logits computed for each position, keyed by the index of the token they
    predict (so after a rejection, the recomputed rows replace the discarded ones)."""

    def __init__(self, model, eos_token_ids=None):
        super().__init__(model, eos_token_ids)
        self.rows: dict[int, torch.Tensor] = {}

    def extend(self, tokens, n_logits):
        logits = super().extend(tokens, n_logits)
        end = self.length
        for r in range(n_logits):
            self.rows[end - n_logits + r + 1] = logits[r]
        return logits


def diagnose_divergence(target, draft, input_ids: torch.Tensor, k: int, max_new_tokens: int,
                        baseline_tokens: Sequence[int], speculative_tokens: Sequence[int]) -> dict:
    """Greedy only. Returns first_diff, margin (baseline top-1 minus top-2 logit there), path_diff (max |logit
    difference| between the one-token and the verify path there) and near_tie (margin <= 2 * path_diff: the
    rounding difference is large enough to swap the top two). Where one sequence is a prefix of the other, first_diff
    is the shorter length and there are no logits to compare (NaN). Equal sequences: ValueError."""
    n_prompt = input_ids.shape[1]
    position = first_difference(baseline_tokens, speculative_tokens)
    if position is None:  # before the two replays, which cost a decoding each
        raise ValueError("diagnose_divergence: the two token sequences are equal, there is no divergence to explain")
    one_token, verify = RecordingLM(target), RecordingLM(target)
    replay_base = generate_baseline(one_token, input_ids, max_new_tokens)
    replay_spec = generate_speculative(verify, draft, input_ids, k, max_new_tokens)
    reproducible = replay_base.tokens == list(baseline_tokens) and replay_spec.tokens == list(speculative_tokens)
    index = n_prompt + position
    if position >= min(len(baseline_tokens), len(speculative_tokens)):
        # one sequence is a prefix of the other: they differ in where EOS / the length cut fell
        return {"first_diff": position, "margin": float("nan"), "path_diff": float("nan"), "near_tie": False,
                "reproducible": reproducible}
    a, b = one_token.rows[index], verify.rows[index]
    top2 = torch.topk(a.double(), 2).values
    margin = float(top2[0] - top2[1])
    path_diff = float((a.double() - b.double()).abs().max())
    return {"first_diff": position, "margin": margin, "path_diff": path_diff,
            "near_tie": bool(margin <= 2 * path_diff), "reproducible": reproducible}
