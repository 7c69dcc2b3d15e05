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


def model_block_budget(budget: int, model_k: int | None) -> int:
    """The most tokens the model drafts in a block the loop allows `budget` tokens (lookup's may use them all): the
    rule HybridDraft, the distribution check's law (through HybridDraft.model_budget) and bench/hybrid_policy.py
    follow."""
    return budget if model_k is None else min(budget, model_k)


class HybridDraft:
    """Each block comes from prompt lookup when it finds a match, else from the model draft.

    Exact: which proposer drafts a block is decided from the context alone (never from the target's logits or the
    accept/reject coins), and the block carries the q of the proposer that made it (lookup's point masses or the
    model's warped distributions), which is what the rule needs. The model draft does not see lookup's blocks as
    they are drafted; its next proposal catches up on them in one call (recorded as catch-up).

    model_k: the model's blocks stop at this many tokens, while lookup's run to the loop's k. A long match is cheap
    to draft and usually kept, a model token costs a draft step: so lookup may draft 6 where the model drafts 3.
    None: the loop's k for both. defer_prefill: the model's prompt pass waits for the first block lookup cannot
    draft (on text that repeats itself throughout it is never paid); False runs it with the target's, in the
    prompt phase."""

    def __init__(self, lookup: PromptLookupDraft, model: ModelDraft | FeatureHeadDraft, *,
                 model_k: int | None = None, defer_prefill: bool = True):
        if lookup.vocab_size != model.vocab_size:
            raise ValueError(f"lookup proposes over {lookup.vocab_size} tokens, the model draft over "
                             f"{model.vocab_size}: both must use the target's vocabulary")
        if model_k is not None and (isinstance(model_k, bool) or not isinstance(model_k, int) or model_k < 1):
            raise ValueError(f"model_k must be a positive integer or None, got {model_k!r}")
        self.lookup, self.model = lookup, model
        self.model_k, self.defer_prefill = model_k, bool(defer_prefill)
        self.vocab_size = model.vocab_size

    def with_parts(self, lookup: PromptLookupDraft, model) -> HybridDraft:
        """The same policy over other proposers (the distribution check's memoised or restricted ones)."""
        return HybridDraft(lookup, model, model_k=self.model_k, defer_prefill=self.defer_prefill)

    def model_budget(self, budget: int) -> int:
        """The most tokens the model drafts in a block the loop allows `budget` tokens."""
        return model_block_budget(budget, self.model_k)

    def attach_target(self, session) -> None:
        """Hands the loop's target session on to a model draft that reads it (a feature head)."""
        attach = getattr(self.model, "attach_target", None)
        if attach is not None:
            attach(session)

    def prefill(self, prompt: Sequence[int]) -> float:
        # Deferred, the catch-up computes the same q, so exactness is untouched.
        return self.lookup.prefill(prompt) + self.model.prefill(prompt, lazy=self.defer_prefill)

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, generator: torch.Generator
    ) -> Proposal:
        found = self.lookup.propose(context, k, sampling, generator)
        if lookup_drafts_block(found.tokens):
            return found
        proposal = self.model.propose(context, self.model_budget(k), sampling, generator)
        proposal.draft_seconds += found.draft_seconds
        return proposal

    def rollback(self, valid_length: int) -> None:
        self.lookup.rollback(valid_length)
        self.model.rollback(valid_length)
