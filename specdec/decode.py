"""Baseline and speculative decoding loops over KV caches, with one timed record per target pass.

Bookkeeping of the speculative loop (L = len(context) at the start of a block):
  - the target has seen context[:L-1]; the verify pass feeds [context[-1], x_1..x_d] and gets the d+1 rows
    p_0..p_d, p_i being the distribution after x_i (p_0 after the context);
  - after n accepted tokens the target keeps context[:L] + x_1..x_n (length L + n) and crops the rest;
  - the draft keeps the longest prefix of what it fed that is still valid (at most L + n); the new last token is
    always unseen by both models. After a fully accepted block the draft has seen neither x_d nor the bonus token,
    so its next call carries two tokens: that catch-up is timed on its own.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import torch

from .drafts.base import DraftProposer, Proposal, as_proposer
from .eos import cut_after_eos
from .errors import VocabularyMismatchError
from .lm import LanguageModelSession, as_session
from .sampling import (
    SamplingConfig,
    _speculative_step_unchecked,
    argmax,
    greedy_step,
    sample_from,
    warp_logits,
)


@dataclass(kw_only=True)
class StepRecord:
    """One target pass. kind: 'prefill' (the prompt), 'block' (draft + verify), 'target' (a one-token step).
    Built by keyword only: a pass without a draft leaves the draft's fields at zero."""

    step: int
    kind: str
    drafted: int = 0
    accepted: int = 0
    emitted: int
    positions: int  # positions the target pass computed logits for (k+1 for a verify pass)
    draft_seconds: float = 0.0
    catchup_seconds: float = 0.0
    catchup_tokens: int = 0
    verify_seconds: float  # the target's forward pass (the one-token step in the baseline)
    decide_seconds: float  # warping, the accept test and sampling
    kernel: str = ""  # the linear backends that target pass ran on (specdec/fp32/kernels.py), where the session says
    draft_kernel: str = ""  # the draft model's linear backends for a one-token draft step ("" without a draft model)


@dataclass
class DecodeResult:
    tokens: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    total_seconds: float = 0.0

    @property
    def target_passes(self) -> int:
        return len(self.steps)

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        return len(self.tokens) / self.target_passes if self.steps else float("nan")

    def step_rows(self) -> list[dict]:
        return [asdict(s) for s in self.steps]

    def summary(self) -> dict:
        return {
            "n_tokens": len(self.tokens),
            "target_passes": self.target_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "tokens_per_pass": self.tokens_per_pass,
            "total_seconds": self.total_seconds,
        }


def _prompt_tokens(input_ids: torch.Tensor) -> list[int]:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape (1, n) with n >= 1, got {tuple(input_ids.shape)}")
    return input_ids[0].tolist()


def _kernel(session, rows: int) -> str:
    kernel_for = getattr(session, "kernel_for", None)
    return kernel_for(rows) if kernel_for else ""


def _draft_kernel(proposer) -> str:
    """The backends of the proposer's draft model for one row: a model draft's own session, or a hybrid's model's."""
    session = getattr(proposer, "session", None) or getattr(getattr(proposer, "model", None), "session", None)
    return _kernel(session, 1)


@contextlib.contextmanager
def argmax_only(session, greedy: bool):
    """A greedy run's target passes (of one logit; verify passes too where the head runs grouped) computed only as far
    as their argmax needs, where the session has such a head (LeanLM.use_argmax_head: the same tokens, fewer bytes
    and multiplies a pass); a sampling run keeps every logit. The
    session's former setting comes back after the run."""
    switch = getattr(session, "set_argmax_only", None)
    if switch is None:
        yield
        return
    before = session.argmax_only
    switch(greedy)
    try:
        yield
    finally:
        switch(before)


def _check_length(max_new_tokens: int) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")


def _choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    if sampling.greedy:
        return int(argmax(logits))
    return sample_from(warp_logits(logits, sampling), generator)


def generate_baseline(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
) -> DecodeResult:
    """Plain autoregressive decoding: one target pass per token."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    _check_length(max_new_tokens)
    prompt = _prompt_tokens(input_ids)
    target: LanguageModelSession = as_session(model)
    generator = torch.Generator().manual_seed(seed)
    result = DecodeResult(tokens=[])
    begin = time.perf_counter()
    with argmax_only(target, sampling.greedy):
        target.reset()
        feed = prompt
        while True:
            start = time.perf_counter()
            logits = target.extend(feed, 1)[0]
            forward = time.perf_counter() - start
            start = time.perf_counter()
            token = _choose(logits, sampling, generator)
            decide = time.perf_counter() - start
            result.tokens.append(token)
            result.steps.append(
                StepRecord(step=len(result.steps), kind="prefill" if feed is prompt else "target", emitted=1,
                           positions=1, verify_seconds=forward, decide_seconds=decide,
                           kernel=_kernel(target, len(feed)))
            )
            if token in target.eos_token_ids or len(result.tokens) >= max_new_tokens:
                break
            feed = [token]
        result.total_seconds = time.perf_counter() - begin
        return result


def _checked(proposal: Proposal, budget: int, sampling: SamplingConfig, vocab_size: int) -> Proposal:
    """A proposer's answer is input to the exact rule: refuse one that cannot be (a bug in a new draft kind)."""
    if len(proposal.tokens) > budget:
        raise ValueError(f"the draft proposed {len(proposal.tokens)} tokens, more than the {budget} asked for")
    if proposal.tokens and not sampling.greedy and (
            proposal.q is None or tuple(proposal.q.shape) != (len(proposal.tokens), vocab_size)):
        shape = None if proposal.q is None else tuple(proposal.q.shape)
        raise ValueError(f"above temperature 0 a proposal needs q of shape ({len(proposal.tokens)}, {vocab_size}): "
                         f"the distributions its tokens were drawn from; got {shape}")
    return proposal


def check_compatible(target: LanguageModelSession, draft: DraftProposer) -> None:
    draft_vocab = getattr(draft, "vocab_size", None)
    if draft_vocab is not None and draft_vocab != target.vocab_size:
        raise VocabularyMismatchError(
            f"draft vocabulary ({draft_vocab} logits) differs from the target's ({target.vocab_size}): "
            "speculative decoding needs draft and target to share one tokenizer and vocabulary"
        )


def generate_speculative(
    target,
    draft,
    input_ids: torch.Tensor,
    k: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    rejection_rule=None,
) -> DecodeResult:
    """Speculative decoding: the draft proposes up to k tokens, one target pass verifies them.

    target: a Hugging Face causal LM or a LanguageModelSession; draft: a model, a session or a DraftProposer.
    At temperature 0 the tokens equal generate_baseline's; above it they are distributed as the target's.
    rejection_rule: replaces the exact rule above temperature 0 (same signature as speculative_step); only the
    distribution checks pass one, a deliberately wrong rule, to show that they can fail.
    """
    rule = _speculative_step_unchecked if rejection_rule is None else rejection_rule
    sampling = SamplingConfig(temperature, top_k, top_p)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    _check_length(max_new_tokens)
    prompt = _prompt_tokens(input_ids)
    target_lm = as_session(target)
    proposer = as_proposer(draft)
    check_compatible(target_lm, proposer)
    attach_target = getattr(proposer, "attach_target", None)
    if attach_target is not None:  # a draft that reads the target's own state (a feature head), before any pass
        attach_target(target_lm)
    draft_kernel = _draft_kernel(proposer)
    eos_ids = target_lm.eos_token_ids
    generator = torch.Generator().manual_seed(seed)
    result = DecodeResult(tokens=[])
    begin = time.perf_counter()

    with argmax_only(target_lm, sampling.greedy):
        target_lm.reset()
        start = time.perf_counter()
        logits = target_lm.extend(prompt, 1)[0]
        prefill = time.perf_counter() - start
        draft_prefill = proposer.prefill(prompt)
        start = time.perf_counter()
        first = _choose(logits, sampling, generator)
        decide = time.perf_counter() - start
        result.tokens.append(first)
        result.steps.append(StepRecord(step=0, kind="prefill", emitted=1, positions=1, draft_seconds=draft_prefill,
                                       verify_seconds=prefill, decide_seconds=decide,
                                       kernel=_kernel(target_lm, len(prompt))))
        context = prompt + [first]

        while first not in eos_ids and len(result.tokens) < max_new_tokens:
            # The verify pass emits a token of its own, so never draft past the length budget.
            budget = min(k, max_new_tokens - len(result.tokens) - 1)
            proposal = None
            if budget > 0:
                proposal = _checked(proposer.propose(context, budget, sampling, generator), budget, sampling,
                                    target_lm.vocab_size).cut_after_eos(eos_ids)
            drafted = proposal.tokens if proposal is not None else []

            start = time.perf_counter()
            logits = target_lm.extend([context[-1]] + drafted, len(drafted) + 1)
            verify = time.perf_counter() - start

            start = time.perf_counter()
            if not drafted:
                n_accepted, next_token = 0, _choose(logits[0], sampling, generator)
            elif sampling.greedy:
                n_accepted, next_token = greedy_step(argmax(logits), torch.tensor(drafted))
            else:
                p = warp_logits(logits, sampling)
                n_accepted, next_token = rule(p, proposal.q, torch.tensor(drafted), generator)
            decide = time.perf_counter() - start

            emitted = cut_after_eos(drafted[:n_accepted] + [next_token], eos_ids)
            target_lm.crop(len(context) + n_accepted)
            context += emitted
            result.tokens += emitted
            proposer.rollback(len(context) - 1)
            result.steps.append(
                StepRecord(
                    step=len(result.steps),
                    kind="block" if drafted else "target",
                    drafted=len(drafted),
                    accepted=n_accepted,
                    emitted=len(emitted),
                    positions=len(drafted) + 1,
                    draft_seconds=proposal.draft_seconds if proposal else 0.0,
                    catchup_seconds=proposal.catchup_seconds if proposal else 0.0,
                    catchup_tokens=proposal.catchup_tokens if proposal else 0,
                    verify_seconds=verify,
                    decide_seconds=decide,
                    kernel=_kernel(target_lm, len(drafted) + 1),
                    draft_kernel=draft_kernel,
                )
            )
            if emitted[-1] in eos_ids:
                break
        result.total_seconds = time.perf_counter() - begin
        return result
