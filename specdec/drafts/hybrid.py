"""HybridDraft: prompt lookup where the context repeats itself, a model draft everywhere else."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..sampling import SamplingConfig
from .base import Proposal
from .lookup import PromptLookupDraft
from .model import ModelDraft

if TYPE_CHECKING:
    from .feature_head import FeatureHeadDraft


def lookup_drafts_block(lookup_tokens: Sequence[int]) -> bool:
    """The hybrid's policy, written once: a block comes from prompt lookup when lookup proposes at least one token
    at this context (lookup_tokens: what it proposes there), else from the model draft. HybridDraft, the
    distribution check's law of its blocks and bench/hybrid_policy.py all decide through this function. It sees
    the context only through lookup's tokens, which is what keeps the hybrid exact (HybridDraft says why)."""
    return len(lookup_tokens) > 0


class HybridDraft:
    """Each block comes from prompt lookup when it finds a match, else from the model draft.

    Exact: which proposer drafts a block is decided from the context alone (never from the target's logits or the
    accept/reject coins), and the block carries the q of the proposer that made it (lookup's point masses or the
    model's warped distributions), which is what the rule needs. The model draft does not see lookup's blocks as
    they are drafted; its next proposal catches up on them in one call (recorded as catch-up), and its first one on
    the prompt too (the model's prompt pass is deferred until a block needs it)."""

    def __init__(self, lookup: PromptLookupDraft, model: ModelDraft | FeatureHeadDraft):
        if lookup.vocab_size != model.vocab_size:
            raise ValueError(f"lookup proposes over {lookup.vocab_size} tokens, the model draft over "
                             f"{model.vocab_size}: both must use the target's vocabulary")
        self.lookup, self.model = lookup, model
        self.vocab_size = model.vocab_size

    def attach_target(self, session) -> None:
        """Hands the loop's target session on to a model draft that reads it (a feature head)."""
        attach = getattr(self.model, "attach_target", None)
        if attach is not None:
            attach(session)

    def prefill(self, prompt: Sequence[int]) -> float:
        # The model's prompt pass waits for the first block lookup cannot draft: on text that repeats itself
        # throughout (code) it is never paid. The catch-up computes the same q, so exactness is untouched.
        return self.lookup.prefill(prompt) + self.model.prefill(prompt, lazy=True)

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, generator: torch.Generator
    ) -> Proposal:
        found = self.lookup.propose(context, k, sampling, generator)
        if lookup_drafts_block(found.tokens):
            return found
        proposal = self.model.propose(context, k, sampling, generator)
        proposal.draft_seconds += found.draft_seconds
        return proposal

    def rollback(self, valid_length: int) -> None:
        self.lookup.rollback(valid_length)
        self.model.rollback(valid_length)
