"""ModelDraft: a smaller causal LM as the draft (a separate model, a truncated or distilled one, or the target's own
first layers through EarlyExitDraft)."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..lm import LanguageModelSession, as_session
from ..sampling import SamplingConfig, argmax, sample_from, warp_logits
from .base import Proposal


def prompt_window_start(prompt_length: int, prompt_window: int | None) -> int:
    """The first prompt token a draft with this prompt_window reads (0: the whole prompt)."""
    return 0 if prompt_window is None else max(0, prompt_length - prompt_window)


class ModelDraft:
    """A smaller causal LM as the draft (a separate model, a truncated model or the target's own first layers)."""

    def __init__(
        self,
        model_or_session,
        eos_token_ids: Sequence[int] | None = None,
        *,
        min_confidence: float | None = None,
        prompt_window: int | None = None,
    ):
        """min_confidence (adaptive drafting, like llama.cpp's --draft-p-min or Hugging Face's
        assistant_confidence_threshold): after proposing a token, stop the block (keeping that token) when the
        draft's probability of it is below this; k is then a maximum. The probability is the warped one the token
        was sampled from, or softmax(logits) at temperature 0. None (the default) always drafts k tokens.

        prompt_window: the draft reads only the prompt's last this many tokens (its positions from 0), so that a long
        prompt's pass costs the draft that many tokens, not the prompt's length; the tokens it proposes may differ,
        the output's distribution cannot (the draft may condition on anything). None (the default): the whole
        prompt."""
        if min_confidence is not None and not (float(min_confidence) >= 0.0):  # also catches NaN
            raise ValueError(f"min_confidence must be >= 0 or None, got {min_confidence!r}")
        if prompt_window is not None and (isinstance(prompt_window, bool) or not isinstance(prompt_window, int)
                                          or prompt_window < 1):
            raise ValueError(f"prompt_window must be a positive integer or None, got {prompt_window!r}")
        self.session: LanguageModelSession = as_session(model_or_session)
        self.vocab_size = self.session.vocab_size
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else self.session.eos_token_ids
        self.min_confidence = None if min_confidence is None else float(min_confidence)
        self.prompt_window = prompt_window
        self.skipped = 0  # the context's tokens before the draft's first: its position 0 is the context's this one

    def prefill(self, prompt: Sequence[int], *, lazy: bool = False) -> float:
        """Start a new sequence. lazy: only forget the last one; the first proposal then catches up on the prompt
        and every token generated before it in one call (for a proposer that may never need this draft)."""
        start = time.perf_counter()
        self.session.reset()
        self.skipped = prompt_window_start(len(prompt), self.prompt_window)
        if not lazy:
            # The whole prompt (or its window), so that the first block only has the target's first token to catch
            # up on.
            self.session.extend(prompt[self.skipped:], 1)
        return time.perf_counter() - start

    def propose(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, generator: torch.Generator
    ) -> Proposal:
        pending = list(context[self.skipped + self.session.length :])
        proposal = Proposal(tokens=[], q=None, catchup_tokens=len(pending) if len(pending) > 1 else 0)
        q_rows: list[torch.Tensor] = []
        feed = pending
        for i in range(k):
            start = time.perf_counter()
            logits = self.session.extend(feed, 1)[0]
            elapsed = time.perf_counter() - start
            if i == 0 and proposal.catchup_tokens:
                proposal.catchup_seconds += elapsed
            else:
                proposal.draft_seconds += elapsed
            if sampling.greedy:
                token = int(argmax(logits))
            else:
                probs = warp_logits(logits, sampling)
                token = sample_from(probs, generator)
                q_rows.append(probs)
            proposal.tokens.append(token)
            if token in self.eos_token_ids:
                break  # nothing after an EOS can be emitted: no more forwards (the loop cuts there anyway)
            # Adaptive stop. Exactness is kept because the decision is a function of the draft's own distribution
            # and its own sample only (never of the target's logits or of the accept/reject coins): the number of
            # tokens drafted is then like any k chosen before verification, and the rejection rule emits each
            # position distributed as the target's whatever that number is.
            if self.min_confidence is not None:
                confidence = float(torch.softmax(logits.float(), dim=-1)[token]) if sampling.greedy \
                    else float(probs[token])
                if confidence < self.min_confidence:
                    break
            feed = [token]
        # The last drafted token is not fed: if the target keeps every token it is caught up next block.
        if q_rows:
            proposal.q = torch.stack(q_rows)
        return proposal

    def rollback(self, valid_length: int) -> None:
        if self.skipped + self.session.length > valid_length:
            self.session.crop(max(0, valid_length - self.skipped))
