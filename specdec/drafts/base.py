"""The draft interface: anything that, given the text so far, proposes up to k tokens and the q they were drawn from.

The decoding loop calls `prefill(prompt)` once, then per block `propose(context, k, ...)` and, after the target
has verified, `rollback(valid_length)` with the length of the prefix the draft may keep. A proposer that holds
state (a KV cache) keeps whatever of it is still a prefix of the context; the rest is fed again next time.
A proposal may hold fewer than k tokens, or none: the loop then runs a plain one-token target step.
A proposer that reads the target's own state (a feature head) also has `attach_target(session)`: the loop calls it
with the target session it runs, before the prompt pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection, Protocol, Sequence

import torch

from ..eos import cut_after_eos
from ..sampling import SamplingConfig


@dataclass
class Proposal:
    tokens: list[int]
    # (len(tokens), V) probabilities each token was sampled from; None at temperature 0, where only argmax counts.
    q: torch.Tensor | None
    draft_seconds: float = 0.0  # draft calls that fed one token
    catchup_seconds: float = 0.0  # the call that fed the tokens the draft had not seen yet, when there were several
    catchup_tokens: int = 0  # how many tokens that catch-up call carried (0 when there was no catch-up)

    def cut_after_eos(self, eos_token_ids: Collection[int]) -> "Proposal":
        """The proposal up to and including its first EOS (with the matching q rows)."""
        tokens = cut_after_eos(self.tokens, eos_token_ids)
        if len(tokens) == len(self.tokens):
            return self
        return replace(self, tokens=tokens, q=None if self.q is None else self.q[: len(tokens)])


class DraftProposer(Protocol):
    vocab_size: int | None  # None: proposes from the target's vocabulary (e.g. prompt lookup)

    def prefill(self, prompt: Sequence[int]) -> float:
        """Start a new sequence; return the seconds spent."""

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, generator: torch.Generator
    ) -> Proposal: ...

    def rollback(self, valid_length: int) -> None: ...


def as_proposer(draft) -> DraftProposer:
    """A proposer as is; a model or a session becomes a ModelDraft."""
    if hasattr(draft, "propose") and hasattr(draft, "rollback"):
        return draft
    from .model import ModelDraft

    return ModelDraft(draft)
