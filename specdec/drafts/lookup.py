"""PromptLookupDraft: no model. Copies what followed the latest earlier occurrence of the context's last n tokens
(prompt lookup / n-gram drafting). Its q is a point mass, so the exact rule accepts a token x with probability p(x)."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..eos import cut_after_eos
from ..sampling import SamplingConfig
from .base import Proposal


class PromptLookupDraft:
    """Propose the up-to-k tokens that followed the latest earlier occurrence of the context's last n tokens,
    trying n = ngram_max down to ngram_min; propose nothing when none of them occurs earlier.

    vocab_size: the width of the target's logits (the one-hot q rows have it). Stateless: prefill and rollback do
    nothing. A proposal stops after a token in eos_token_ids (nothing after an EOS can be emitted).
    """

    def __init__(self, vocab_size: int, ngram_max: int = 3, ngram_min: int = 1, *,
                 eos_token_ids: Sequence[int] = ()):
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if not (isinstance(ngram_min, int) and isinstance(ngram_max, int) and 1 <= ngram_min <= ngram_max):
            raise ValueError(f"need integers 1 <= ngram_min <= ngram_max, got ngram_min={ngram_min!r}, "
                             f"ngram_max={ngram_max!r}")
        self.vocab_size = vocab_size
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.eos_token_ids = frozenset(eos_token_ids)

    def prefill(self, prompt: Sequence[int]) -> float:
        return 0.0

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        """The continuation (at most k tokens) of the latest earlier match of the longest matching suffix."""
        context = list(context)
        length = len(context)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            suffix = context[length - n:]
            # Latest start first; start + n <= length - 1 so that at least one token follows the match.
            for start in range(length - n - 1, -1, -1):
                if context[start:start + n] == suffix:
                    return context[start + n:start + n + k]
        return []

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, generator: torch.Generator
    ) -> Proposal:
        start = time.perf_counter()
        tokens = cut_after_eos(self.lookup(context, k), self.eos_token_ids)
        q = None
        if tokens and not sampling.greedy:
            # A point mass on each proposed token: the token *was* drawn from it, so the rejection rule applies
            # (accept with min(1, p(x) / 1) = p(x); residual normalise(max(0, p - onehot(x)))).
            q = torch.nn.functional.one_hot(torch.tensor(tokens), self.vocab_size).float()
        return Proposal(tokens=tokens, q=q, draft_seconds=time.perf_counter() - start)

    def rollback(self, valid_length: int) -> None:
        pass
