"""Distributional exactness on a real pair: the exact law of the first few generated tokens under the target, under
the speculative loop with the exact rule and under deliberately wrong rules; samples drawn through the study's own
speculative loop; chi-square tests whose sample size is chosen, per test, to have power against a wrong sampler.

Why it is cheap: with top-k warping the continuation space is small (top_k ** length sequences), and both models
sit behind PrefixMemoLM, so each distinct prefix costs one forward however many samples pass through it.
See docs/distribution-check.md.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from specdec import sampling as engine_sampling  # the module, not its names: see _engine_acceptance
from specdec.decode import generate_speculative
from specdec.drafts import DraftResources, HybridDraft, ModelDraft, PromptLookupDraft, get_kind
from specdec.drafts.base import Proposal
from specdec.drafts.feature_head import FeatureHeadDraft
from specdec.drafts.model import prompt_window_start
from specdec.drafts import hybrid as hybrid_draft  # likewise: the hybrid's policy, looked up at every call
from specdec.eos import cut_after_eos
from specdec.lm import PrefixMemoLM
from specdec.sampling import SamplingConfig, sample_from, warp_logits
from specdec.study.verify.distribution_verdict import DistributionSettings
from specdec.study.decoding.interleave import batch_of_one
from specdec.study.stats import (GoodnessOfFit, SampleSize, chi_square_gof, chi_square_power, samples_for_power,
                                 total_variation)

Law = dict  # outcome (tuple of generated tokens) -> probability
Dist = dict  # token -> probability (a sparse, normalised, float64 distribution over the vocabulary)


# --- samplers: the exact rule and the deliberately wrong ones, as a step for generate_speculative and as a law -------
def residual_drawn_from_p(p, q, draft_tokens, generator):
    """Deliberately wrong rule: the acceptance test is right, but on rejection the token is drawn from p instead of
    normalise(max(0, p - q)). Its output over-weights tokens the draft likes; the check must reject it."""
    k = draft_tokens.shape[0]
    for i in range(k):
        x = int(draft_tokens[i])
        if torch.rand(1, generator=generator, dtype=torch.float64).item() * float(q[i, x]) >= float(p[i, x]):
            return i, sample_from(p[i].double(), generator)
    return k, sample_from(p[k].double(), generator)


def every_draft_token_accepted(p, q, draft_tokens, generator):
    """Deliberately wrong rule: keep every draft token, then draw the bonus token from p. Its output follows the
    draft wherever the draft drafts: a far stronger error than residual_drawn_from_p where p and q are close."""
    k = draft_tokens.shape[0]
    return k, sample_from(p[k].double(), generator)


# The exact rule's two parts are the engine's own functions, looked up in specdec.sampling at every call (so that
# the laws follow the engine, and a test can replace them there); these only convert the sparse dicts.
def _engine_acceptance(p_x: float, q_x: float) -> float:
    """specdec.sampling.acceptance_probability at one token."""
    return float(engine_sampling.acceptance_probability(torch.tensor(p_x, dtype=torch.float64),
                                                        torch.tensor(q_x, dtype=torch.float64)))


def _engine_residual(p: Dist, q: Dist) -> Dist:
    """specdec.sampling.residual_distribution over the union of both supports (every other token is 0 in both)."""
    tokens = sorted(set(p) | set(q))
    dense = lambda dist: torch.tensor([dist.get(t, 0.0) for t in tokens], dtype=torch.float64)
    residual = engine_sampling.residual_distribution(dense(p), dense(q)).tolist()
    return {t: r for t, r in zip(tokens, residual) if r > 0}


@dataclass(frozen=True)
class Sampler:
    """A rejection rule, as generate_speculative runs it (step; None: the exact rule) and as the law computes it:
    accept(p(x), q(x)) the probability of keeping draft token x, on_rejection(p, q) the distribution of the token
    drawn at the first rejection."""

    name: str
    step: Callable | None
    accept: Callable[[float, float], float]
    on_rejection: Callable[[Dist, Dist], Dist]


EXACT = Sampler("exact rule", None, _engine_acceptance, _engine_residual)
# In order of preference: the first is the subtle error the check was built to catch; the second is used on a
# test where the first is too close to the target's law to be detected with the allowed number of samples.
WRONG_SAMPLERS: tuple[Sampler, ...] = (
    Sampler("residual drawn from p", residual_drawn_from_p, _engine_acceptance, lambda p, q: p),
    Sampler("every draft token accepted", every_draft_token_accepted, lambda p_x, q_x: 1.0, lambda p, q: p),
)
SAMPLERS = {s.name: s for s in (EXACT, *WRONG_SAMPLERS)}
WRONG_RULES: dict[str, Callable] = {s.name: s.step for s in WRONG_SAMPLERS}


def exact_first_tokens(
    target: PrefixMemoLM, prompt: Sequence[int], sampling: SamplingConfig, length: int
) -> dict[tuple[int, ...], float]:
    """P(first `length` generated tokens) under the warped target, by enumerating every continuation with
    non-zero probability. A sequence that reaches EOS ends there (the loop stops on EOS)."""
    prompt = tuple(prompt)
    exact: dict[tuple[int, ...], float] = {}

    def walk(sequence: tuple[int, ...], probability: float) -> None:
        if len(sequence) == length or (sequence and sequence[-1] in target.eos_token_ids):
            exact[sequence] = probability
            return
        p = warp_logits(target.next_token_logits(prompt + sequence), sampling).double()
        p = p / p.sum()  # the float32 softmax is renormalised so that the enumeration sums to 1 in float64
        for token in torch.nonzero(p).flatten().tolist():
            walk(sequence + (token,), probability * float(p[token]))

    walk((), 1.0)
    return exact


def _sparse(probs: torch.Tensor) -> Dist:
    """The non-zero entries of a probability vector, renormalised in float64."""
    index = torch.nonzero(probs).flatten()
    values = probs[index].double()
    values = values / values.sum()
    return dict(zip(index.tolist(), values.tolist()))


# --- the draft's law per block, pluggable by proposer class ------------------------------------------------------
class DraftLaw(Protocol):
    def next(self, context: tuple[int, ...], drafted: tuple[int, ...], budget: int) -> Dist | None:
        """The distribution the proposer draws its next token from, in a block that started at `context` (prompt +
        generated tokens) with this budget, after it drafted `drafted`; None where its proposal ends."""


class ModelDraftLaw:
    """ModelDraft: token i + 1 drawn from the warped draft distribution after the block's context and its first i
    tokens; the block stops at the budget, after an EOS, or (min_confidence) after a token whose probability under
    the distribution it was drawn from is below the threshold. A draft with a prompt_window reads the context from
    its `skipped`-th token on, as set by its prefill (MemoisedPair prefills the law's proposer, as the loop does)."""

    def __init__(self, proposer: ModelDraft, sampling: SamplingConfig):
        session = proposer.session
        if not hasattr(session, "next_token_logits"):
            raise TypeError(f"{type(proposer).__name__}: the distribution check needs the draft's logits by prefix "
                            f"(a PrefixMemoLM session), not a {type(session).__name__}")
        self.proposer, self.session, self.sampling = proposer, session, sampling
        self.min_confidence, self.eos_token_ids = proposer.min_confidence, proposer.eos_token_ids
        self._warped: dict[tuple[int, ...], torch.Tensor] = {}
        self._q: dict[tuple[int, ...], Dist] = {}

    def warped(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self._warped:
            self._warped[prefix] = warp_logits(self.session.next_token_logits(prefix), self.sampling)
        return self._warped[prefix]

    def q(self, prefix: tuple[int, ...]) -> Dist:
        if prefix not in self._q:
            self._q[prefix] = _sparse(self.warped(prefix))
        return self._q[prefix]

    def next(self, context, drafted, budget):
        if len(drafted) >= budget:
            return None
        context = context[self.proposer.skipped:]  # what the draft reads (its prompt window)
        if drafted:
            last = drafted[-1]
            if last in self.eos_token_ids:
                return None
            # the very float32 value ModelDraft compares (the warped probability the token was drawn from)
            if self.min_confidence is not None and \
                    float(self.warped(context + drafted[:-1])[last]) < self.min_confidence:
                return None
        return self.q(context + drafted)


class LookupLaw:
    """PromptLookupDraft: the proposal is a function of the context (q one-hot on each proposed token)."""

    def __init__(self, proposer: PromptLookupDraft, sampling: SamplingConfig):
        self.proposer = proposer
        self._proposals: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def proposal(self, context: tuple[int, ...], budget: int) -> list[int]:
        key = (context, budget)
        if key not in self._proposals:
            self._proposals[key] = cut_after_eos(self.proposer.lookup(context, budget), self.proposer.eos_token_ids)
        return self._proposals[key]

    def next(self, context, drafted, budget):
        tokens = self.proposal(context, budget)
        return {tokens[len(drafted)]: 1.0} if len(drafted) < len(tokens) else None


class HybridLaw:
    """HybridDraft: the lookup's block or the model draft's, as the engine's policy (lookup_drafts_block) chooses."""

    def __init__(self, proposer: HybridDraft, sampling: SamplingConfig):
        self.lookup, self.model = draft_law(proposer.lookup, sampling), draft_law(proposer.model, sampling)
        self.model_budget = proposer.model_budget

    def next(self, context, drafted, budget):
        if hybrid_draft.lookup_drafts_block(self.lookup.proposal(context, budget)):
            return self.lookup.next(context, drafted, budget)
        return self.model.next(context, drafted, self.model_budget(budget))


class MemoisedHeadDraft:
    """A feature head's proposer as the check runs it: the head's state per block state (the block's context and
    what it drafted so far, whole-vocabulary ids), computed once (FeatureHeadDraft.block_start from a fresh cache,
    then block_step per drafted token) and memoised, as PrefixMemoLM does for a model draft's logits; each token drawn
    by the head's own code (FeatureHeadDraft.draw) from the warped scores. kept: the reduced vocabulary the samples
    run on (id i < n stands for kept[i], n + t for token t: SubVocabularySession), None: the whole one. Restricted
    copies share one memo.

    prompt_length, depth: as PrefixMemoLM's, the states that can change the first `depth` generated tokens are
    computed; a draft token past them (a block that starts at generated token e drafts its j-th token at e + j) is
    drawn from the state of the first block (prompt and first generated token), which every sequence has and whose
    support the laws keep: any distribution does there, since no compared token depends on it."""

    def __init__(self, head: FeatureHeadDraft, kept: Sequence[int] | None = None, memo: dict | None = None, *,
                 prompt_length: int | None = None, depth: int | None = None):
        self.head, self.kept = head, None if kept is None else list(kept)
        self.prompt_length, self.depth = prompt_length, depth
        self.vocab_size = head.vocab_size if kept is None else len(self.kept)  # the width of its q rows
        self._memo = {} if memo is None else memo
        eos = head.eos_token_ids
        self.eos_token_ids = eos if kept is None else frozenset(i for i, t in enumerate(self.kept) if t in eos)
        if kept is not None:  # each kept token's row of the drafting vocabulary's logits (-1: never drafted)
            rows = {int(token): i for i, token in enumerate(head._vocab)}
            self._rows = torch.tensor([rows.get(token, -1) for token in self.kept])

    def restricted(self, kept: Sequence[int]) -> MemoisedHeadDraft:
        return MemoisedHeadDraft(self.head, kept, self._memo, prompt_length=self.prompt_length, depth=self.depth)

    def state(self, context: tuple[int, ...], drafted: tuple[int, ...]):
        if self.depth is not None and len(context) - self.prompt_length + len(drafted) >= self.depth:
            context, drafted = context[:self.prompt_length + 1], ()  # no compared token depends on it
        key = (context, drafted)
        if key not in self._memo:
            self._memo[key] = self.head.block_start(context) if not drafted else \
                self.head.block_step(self.state(context, drafted[:-1]), drafted[-1])
        return self._memo[key]

    def scores(self, context: tuple[int, ...], drafted: tuple[int, ...]) -> torch.Tensor:
        """Scores of the next draft token over this proposer's vocabulary (-inf off the drafting vocabulary)."""
        logits = self.state(context, drafted).logits
        if self.kept is None:
            return self.head.scatter(logits)
        return torch.where(self._rows >= 0, logits[self._rows.clamp(min=0)], float("-inf"))

    def prefill(self, prompt: Sequence[int], *, lazy: bool = True) -> float:
        return 0.0

    def rollback(self, valid_length: int) -> None:
        pass

    def _whole(self, tokens: Sequence[int]) -> tuple[int, ...]:
        if self.kept is None:
            return tuple(int(t) for t in tokens)
        n = len(self.kept)
        return tuple(self.kept[t] if t < n else t - n for t in map(int, tokens))

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig, generator: torch.Generator
                ) -> Proposal:
        if sampling.greedy:
            raise ValueError("the distribution check runs above temperature 0")
        context, drafted, tokens, q_rows = self._whole(context), (), [], []
        for _ in range(k):
            token, probs = FeatureHeadDraft.draw(self.scores(context, drafted), sampling, generator)
            tokens.append(token)
            q_rows.append(probs)
            drafted += self._whole([token])
            if token in self.eos_token_ids:
                break
        return Proposal(tokens=tokens, q=torch.stack(q_rows))


def memoised_heads(proposer, prompt_length: int, depth: int):
    """The proposer with its feature head (alone, or behind prompt lookup in a hybrid) memoised for the check."""
    if isinstance(proposer, FeatureHeadDraft):
        return MemoisedHeadDraft(proposer, prompt_length=prompt_length, depth=depth)
    if isinstance(proposer, HybridDraft) and isinstance(proposer.model, FeatureHeadDraft):
        return proposer.with_parts(proposer.lookup, MemoisedHeadDraft(proposer.model, prompt_length=prompt_length,
                                                                      depth=depth))
    return proposer


def restricted_heads(proposer, kept: Sequence[int]):
    """memoised_heads' proposer on the reduced vocabulary of the samples (its memo shared)."""
    if isinstance(proposer, MemoisedHeadDraft):
        return proposer.restricted(kept)
    if isinstance(proposer, HybridDraft) and isinstance(proposer.model, MemoisedHeadDraft):
        head, lookup = proposer.model.restricted(kept), proposer.lookup  # lookup: stateless, its q as wide as kept
        return proposer.with_parts(PromptLookupDraft(len(kept), lookup.ngram_max, lookup.ngram_min,
                                                     eos_token_ids=sorted(head.eos_token_ids)), head)
    return proposer


class HeadLaw:
    """MemoisedHeadDraft: token i + 1 drawn from the warped scores of the block's state after its first i tokens;
    the block stops at the budget or after an EOS."""

    def __init__(self, proposer: MemoisedHeadDraft, sampling: SamplingConfig):
        if proposer.kept is not None:
            raise TypeError("the laws are computed on the whole vocabulary")
        self.proposer, self.sampling = proposer, sampling
        self._q: dict[tuple, Dist] = {}

    def next(self, context, drafted, budget):
        if len(drafted) >= budget or (drafted and drafted[-1] in self.proposer.eos_token_ids):
            return None
        key = (context, drafted)
        if key not in self._q:
            self._q[key] = _sparse(warp_logits(self.proposer.scores(context, drafted), self.sampling))
        return self._q[key]


_DRAFT_LAWS: list[tuple[type, Callable[[Any, SamplingConfig], DraftLaw]]] = []


def register_draft_law(proposer_class: type, factory: Callable[[Any, SamplingConfig], DraftLaw]) -> None:
    """How the check computes the law of a proposer class's blocks (factory(proposer, sampling) -> DraftLaw). The
    latest registration that the proposer is an instance of wins, so a subclass registered after its base class
    gets its own law."""
    _DRAFT_LAWS.insert(0, (proposer_class, factory))


register_draft_law(ModelDraft, ModelDraftLaw)
register_draft_law(PromptLookupDraft, LookupLaw)
register_draft_law(HybridDraft, HybridLaw)
register_draft_law(MemoisedHeadDraft, HeadLaw)


def draft_law(proposer, sampling: SamplingConfig) -> DraftLaw:
    for proposer_class, factory in _DRAFT_LAWS:
        if isinstance(proposer, proposer_class):
            return factory(proposer, sampling)
    raise TypeError(f"no law is registered for {type(proposer).__name__} proposals: the distribution check cannot "
                    "compute its exact laws (specdec.study.verify.distribution.register_draft_law)")


# --- the memoised pair -------------------------------------------------------------------------------------------
class SubVocabularySession:
    """A restricted PrefixMemoLM seen through small token ids: id i < n stands for kept[i]; an id n + t feeds token
    t of the full vocabulary unchanged (for a prompt token that is not kept)."""

    def __init__(self, memo: PrefixMemoLM, kept: Sequence[int]):
        self.memo = memo
        self.kept = list(kept)
        self.vocab_size = len(self.kept)
        self.eos_token_ids = frozenset(i for i, token in enumerate(self.kept) if token in memo.eos_token_ids)

    @property
    def length(self) -> int:
        return self.memo.length

    def reset(self) -> None:
        self.memo.reset()

    def crop(self, length: int) -> None:
        self.memo.crop(length)

    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        n = self.vocab_size
        return self.memo.extend([self.kept[t] if t < n else t - n for t in tokens], n_logits)


@dataclass(frozen=True)
class Laws:
    """The exact laws of the first `length` tokens at one k, and what the loop visits to draw them."""

    by_sampler: dict[str, Law]  # sampler name (EXACT and every WRONG_SAMPLERS) -> law
    prefixes: frozenset  # generated-token prefixes whose logits the loop can read (deeper ones are truncated)
    kept: tuple[int, ...]  # tokens of non-zero probability under either model there, and the prompt's tokens


@dataclass(frozen=True)
class DistributionCheck:
    fit: GoodnessOfFit
    wrong_fit: GoodnessOfFit
    n_outcomes: int  # continuations with non-zero target probability
    n_prefixes: int  # prefixes the loop can visit at this k, each one target and one draft forward
    n_kept_tokens: int  # tokens with non-zero probability under either model at any of those prefixes (+ prompt's)
    wrong_sampler: str = WRONG_SAMPLERS[0].name
    tv_distance: float = float("nan")  # between the target's law and the wrong sampler's
    power: float = float("nan")  # of the test against the wrong sampler at this N and the planned threshold


class MemoisedPair:
    """Target and draft behind prefix memos for one prompt: the exact laws of the first `length` tokens, and samples
    of them drawn by generate_speculative over the very same logits.

    draft_spec: the draft as the config defines it ({kind: model | hybrid | prompt_lookup | ..., fields}); its
    proposer is built by the draft-kind registry over the memoised draft (min_confidence: the older way to ask for
    {kind: model, min_confidence: ...}). draft_model may be None for a kind that loads no model.

    Prefixes up to length - 1 generated tokens decide the compared tokens; deeper ones are answered from that depth
    (PrefixMemoLM.exact_depth). For each k, the dynamic program that computes the laws (laws()) also records every
    prefix the loop can read; the loop then runs on restricted copies of the memos holding only those prefixes,
    over the union of both models' supports there and the prompt's tokens (SubVocabularySession): every other token
    has probability 0 under p and q alike, so the draws follow exactly the same distributions, ~1000x cheaper.
    """

    def __init__(self, target_model, draft_model, input_ids: torch.Tensor, sampling: SamplingConfig, length: int,
                 min_confidence: float | None = None, *, draft_spec: Mapping | None = None):
        if sampling.greedy:
            raise ValueError("a distribution check needs temperature > 0")
        if sampling.top_k is None:
            raise ValueError("a distribution check enumerates continuations: it needs a top_k")
        if not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive integer, got {length!r}")
        spec = dict(draft_spec) if draft_spec is not None else {"kind": "model", "model": "draft"}
        if min_confidence is not None:
            if spec.get("min_confidence", min_confidence) != min_confidence:
                raise ValueError(f"min_confidence {min_confidence} differs from the draft spec's "
                                 f"{spec['min_confidence']}")
            spec["min_confidence"] = min_confidence
        self.draft_spec, self.kind = spec, get_kind(spec["kind"])
        self.length, self.sampling, self.min_confidence = length, sampling, spec.get("min_confidence")
        self.prompt = tuple(input_ids[0].tolist())
        self.target = PrefixMemoLM(target_model, exact_depth=length - 1, prompt_length=len(self.prompt))
        if self.kind.model is not None and draft_model is None:
            raise ValueError(f"a {spec['kind']!r} draft needs its model")
        # A draft with a model of its own kind (a feature head) reads the target's features: its proposer is built
        # once over the target as given and its head memoised by block state (MemoisedHeadDraft); a model draft
        # sits behind a prefix memo of its own.
        self.heads = None
        if self.kind.load is not None:
            self.heads = memoised_heads(self.kind.build(spec, DraftResources(
                target=target_model, vocab_size=self.target.vocab_size, eos_token_ids=self.target.eos_token_ids,
                draft_model=lambda: draft_model)), len(self.prompt), length)
        # A model draft with a prompt_window reads the prompt from this token on (its memo's prompt: the window).
        self.draft_prompt = self.prompt[prompt_window_start(len(self.prompt), spec.get("prompt_window")):]
        self.draft = None if draft_model is None or self.kind.model is None or self.heads is not None else \
            PrefixMemoLM(draft_model, eos_token_ids=self.target.eos_token_ids, exact_depth=length - 1,
                         prompt_length=len(self.draft_prompt))
        self.exact = exact_first_tokens(self.target, self.prompt, sampling, length)
        # The proposer over the full-vocabulary memos, prefilled as the loop prefills it (which sets a windowed
        # draft's start): what the laws are computed from.
        proposer = self.heads or self._proposer(self.target, self.draft)
        proposer.prefill(self.prompt)
        self.law = draft_law(proposer, sampling)
        self._p: dict[tuple[int, ...], Dist] = {}
        self._laws: dict[int, Laws] = {}
        self._sessions: dict[int, tuple] = {}

    def _proposer(self, target, draft):
        """The draft's proposer, built by its kind from these sessions (as the decode jobs build it)."""
        return self.kind.build(self.draft_spec, DraftResources(
            target=target, vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids,
            draft_model=(lambda: draft) if draft is not None else None))

    @property
    def kept(self) -> list[int]:
        """Tokens the loop runs on, over every k computed so far."""
        return sorted(set().union(*(laws.kept for laws in self._laws.values())))

    @property
    def n_prefixes(self) -> int:
        """Prefixes the loop can read, over every k computed so far."""
        return len(set().union(*(laws.prefixes for laws in self._laws.values())))

    def _target_p(self, generated: tuple[int, ...]) -> Dist:
        if generated not in self._p:
            self._p[generated] = _sparse(warp_logits(self.target.next_token_logits(self.prompt + generated),
                                                     self.sampling))
        return self._p[generated]

    def laws(self, k: int) -> Laws:
        """The exact law of the first `length` tokens under every sampler (EXACT and WRONG_SAMPLERS) at this k.

        A dynamic program over emitted prefixes that mirrors generate_speculative (max_new_tokens = max(length,
        k + 2), as samples() runs it): the first token from the target at the prompt; then blocks with budget
        min(k, max_new_tokens - emitted - 1) (0: a plain target step), draft tokens from the proposer's law
        (self.law) while each is kept with the sampler's probability, the sampler's token at the first rejection,
        the target's bonus token after a fully kept block, nothing after an EOS. Because the draft and both models
        depend on the context only, the emitted prefix at a block boundary is the whole state. Draft tokens past
        the first `length` outputs are marginalised (they cannot change them). Every draft-tree node is visited,
        reachable or not by acceptance, since the loop's verify pass reads the target there."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        if k in self._laws:
            return self._laws[k]
        samplers = (EXACT, *WRONG_SAMPLERS)
        n_samplers, length, eos = len(samplers), self.length, self.target.eos_token_ids
        max_new_tokens = max(length, k + 2)
        laws: list[dict] = [defaultdict(float) for _ in samplers]
        states: list[dict] = [defaultdict(lambda: np.zeros(n_samplers)) for _ in range(length)]
        prefixes: set[tuple[int, ...]] = set()
        kept: set[int] = set(self.prompt)

        def emit(sequence: tuple[int, ...], weight: np.ndarray) -> None:
            if not (weight > 0).any():
                return
            if len(sequence) >= length or sequence[-1] in eos:
                for r in np.flatnonzero(weight > 0):
                    laws[r][sequence[:length]] += float(weight[r])
            else:
                states[len(sequence)][sequence] += weight

        def visit(generated: tuple[int, ...]) -> Dist:
            """A prefix the loop can read: both models' supports there are kept."""
            p = self._target_p(generated)
            if generated not in prefixes:
                prefixes.add(generated)
                kept.update(p)
                if self.draft is not None:
                    kept.update(torch.nonzero(warp_logits(self.draft.next_token_logits(self.draft_prompt + generated),
                                                          self.sampling)).flatten().tolist())
            return p

        def walk(start: tuple[int, ...], budget: int, drafted: tuple[int, ...], weight: np.ndarray) -> None:
            """weight: per sampler, the probability of reaching block start `start` and keeping every token of
            `drafted`."""
            current = start + drafted
            if len(current) >= length:
                emit(current, weight)
                return
            if drafted and drafted[-1] in eos:  # the verify pass still reads the target after a drafted EOS
                visit(current)
                emit(current, weight)
                return
            p = visit(current)
            q = self.law.next(self.prompt + start, drafted, budget) if budget > 0 else None
            kept.update(q or ())  # a head's support depends on its block's start, not on the prefix alone
            if q is None:  # the bonus token after a fully kept block, or a plain target step
                for token, p_token in p.items():
                    emit(current + (token,), weight * p_token)
                return
            rejected = np.zeros(n_samplers)
            for x, q_x in q.items():
                keep = np.array([s.accept(p.get(x, 0.0), q_x) for s in samplers])
                walk(start, budget, drafted + (x,), weight * q_x * keep)
                rejected += weight * q_x * (1.0 - keep)
            for r, sampler in enumerate(samplers):
                if rejected[r] > 0:
                    for token, prob in sampler.on_rejection(p, q).items():
                        one = np.zeros(n_samplers)
                        one[r] = rejected[r] * prob
                        emit(current + (token,), one)

        for token, p_token in visit(()).items():  # the first token: the target's, at the prompt (prefill)
            emit((token,), np.full(n_samplers, p_token))
        for emitted in range(1, length):
            for start, weight in list(states[emitted].items()):
                walk(start, min(k, max_new_tokens - emitted - 1), (), weight)
        result = Laws({s.name: dict(law) for s, law in zip(samplers, laws)}, frozenset(prefixes), tuple(sorted(kept)))
        self._laws[k] = result
        return result

    def _sampling_sessions(self, k: int):
        if k not in self._sessions:
            laws = self.laws(k)
            keys = [self.prompt + prefix for prefix in laws.prefixes]
            target = SubVocabularySession(self.target.restricted(laws.kept, keys), laws.kept)
            draft_keys = [self.draft_prompt + prefix for prefix in laws.prefixes]
            draft = None if self.draft is None else \
                SubVocabularySession(self.draft.restricted(laws.kept, draft_keys), laws.kept)
            index = {token: i for i, token in enumerate(laws.kept)}
            input_ids = torch.tensor([[index[token] for token in self.prompt]])
            self._sessions[k] = (target, draft, input_ids, laws.kept)
        return self._sessions[k]

    def samples(self, k: int, n_samples: int, seed: int = 0, rejection_rule=None) -> list[tuple[int, ...]]:
        """n_samples runs of generate_speculative (seeds seed, seed + 1, ...), first `length` tokens each, in full
        vocabulary ids. Each run goes on for max(length, k + 2) tokens so that its first draft block holds k tokens.
        rejection_rule: a wrong rule's step, or a Sampler (None: the exact rule)."""
        if isinstance(rejection_rule, Sampler):
            rejection_rule = rejection_rule.step
        target, draft, input_ids, kept = self._sampling_sessions(k)
        proposer = restricted_heads(self.heads, kept) if self.heads is not None else self._proposer(target, draft)
        max_new_tokens = max(self.length, k + 2)
        out = []
        for i in range(n_samples):
            result = generate_speculative(
                target, proposer, input_ids, k, max_new_tokens, self.sampling.temperature, self.sampling.top_k,
                self.sampling.top_p, seed=seed + i, rejection_rule=rejection_rule,
            )
            out.append(tuple(kept[t] for t in result.tokens[: self.length]))
        return out

    def check(self, k: int, n_samples: int, wrong_rule: str = WRONG_SAMPLERS[0].name, seed: int = 0,
              threshold: float | None = None) -> DistributionCheck:
        """Both samplers at one N (no sizing); threshold: where the power is computed (default: none computed)."""
        laws = self.laws(k)
        wrong = laws.by_sampler[wrong_rule]
        return DistributionCheck(
            fit=chi_square_gof(self.samples(k, n_samples, seed), self.exact),
            wrong_fit=chi_square_gof(self.samples(k, n_samples, seed, WRONG_RULES[wrong_rule]), self.exact),
            n_outcomes=len(self.exact),
            n_prefixes=len(laws.prefixes),
            n_kept_tokens=len(laws.kept),
            wrong_sampler=wrong_rule,
            tv_distance=total_variation(self.exact, wrong),
            power=float("nan") if threshold is None else chi_square_power(self.exact, wrong, n_samples, threshold),
        )


def check_exact_law(pair: MemoisedPair, k: int, tolerance: float = 1e-9) -> None:
    """The dynamic program with the exact rule must give the target's own law: a self-check of the laws."""
    law = pair.laws(k).by_sampler[EXACT.name]
    worst = total_variation(law, pair.exact)
    if worst > tolerance:
        raise RuntimeError(f"the exact rule's law at k={k} differs from the target's by {worst:.3g} in total "
                           "variation: the dynamic program does not mirror the decoding loop")


# --- choosing N --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Which wrong sampler a test is run against, at which N, with what power."""

    sampler: str
    n_samples: int
    power: float  # at n_samples and the threshold
    has_power: bool  # power >= the target power
    n_needed: int | None  # the N that reaches the target power, whatever the cap (None: no N does)
    tv_distance: float  # between the target's law and this sampler's
    tv_by_sampler: dict[str, float] = field(default_factory=dict)
    n_needed_by_sampler: dict[str, int | None] = field(default_factory=dict)


def plan_test(exact: Law, wrong_laws: Mapping[str, Law], threshold: float, power: float = 0.99,
              max_samples: int = 100_000, min_samples: int = 1, samples: int | None = None) -> Plan:
    """The wrong sampler and the N of one test. Wrong samplers are tried in order; the first whose test reaches
    `power` at the threshold with N <= max_samples is used at the smallest such N (at least min_samples). With a
    fixed N (samples), the first with that power at N. When none has the power, the test is run at the cap (or the
    fixed N) against the sampler that needs the fewest samples: it cannot count as evidence against that sampler."""
    sizes: dict[str, SampleSize] = {}
    for name, law in wrong_laws.items():
        if samples is not None:
            at_n = chi_square_power(exact, law, samples, threshold)
            needed = samples_for_power(exact, law, threshold, power, max(samples, 1), 1)
            sizes[name] = SampleSize(samples if at_n >= power else None, at_n, needed.n_needed)
        else:
            sizes[name] = samples_for_power(exact, law, threshold, power, max_samples, min_samples)
    tvs = {name: total_variation(exact, law) for name, law in wrong_laws.items()}
    needed = {name: size.n_needed for name, size in sizes.items()}
    powered = [name for name, size in sizes.items() if size.n is not None]
    if powered:
        name = powered[0]
        return Plan(name, sizes[name].n, sizes[name].power, True, sizes[name].n_needed, tvs[name], tvs, needed)
    # no power: the sampler closest to having it (fewest samples needed, else the largest power at the cap)
    name = min(sizes, key=lambda s: (sizes[s].n_needed is None, sizes[s].n_needed or 0, -sizes[s].power))
    n = samples if samples is not None else max_samples
    return Plan(name, n, sizes[name].power, False, sizes[name].n_needed, tvs[name], tvs, needed)


def run_distribution_checks(target_model, draft_model, prompts, settings: DistributionSettings,
                            min_confidence: float | None = None, log=print, *, draft_spec: Mapping | None = None,
                            family_size: int | None = None) -> list[dict]:
    """One row per (prompt, k): the laws, the chosen wrong sampler and N (plan_test at the Bonferroni threshold
    alpha / family_size; default family: these tests), and the chi-square fits of the speculative samples and of
    that wrong sampler's samples against the exact target law of the first settings.tokens tokens. The draft is
    built from draft_spec by its kind (min_confidence: the older way to give {kind: model, min_confidence})."""
    sampling = SamplingConfig(settings.temperature, settings.top_k, None)
    chosen = prompts.head(settings.prompts_per_domain)
    family_size = family_size or len(chosen) * len(settings.k)
    threshold = settings.alpha / family_size
    if settings.samples is not None:
        log(f"a fixed N = {settings.samples} for every test (distribution_check.samples): min_samples and "
            "max_samples are not used; each test's power at that N is reported")
    rows = []
    for prompt in chosen.itertuples(index=False):
        input_ids = batch_of_one(prompt.input_ids)
        start = time.perf_counter()
        pair = MemoisedPair(target_model, draft_model, input_ids, sampling, settings.tokens, min_confidence,
                            draft_spec=draft_spec)
        log(f"{prompt.prompt_id}: {len(pair.exact)} continuations ({time.perf_counter() - start:.0f}s of forwards)")
        for k in settings.k:
            start = time.perf_counter()
            laws = pair.laws(k)
            check_exact_law(pair, k)
            wrong_laws = {s.name: laws.by_sampler[s.name] for s in WRONG_SAMPLERS}
            plan = plan_test(pair.exact, wrong_laws, threshold, settings.power, settings.max_samples,
                             settings.min_samples, settings.samples)
            log(f"  k={k}: {len(laws.prefixes)} prefixes, {len(laws.kept)} kept tokens; TV distances "
                + ", ".join(f"{name} {tv:.4g}" for name, tv in plan.tv_by_sampler.items())
                + f" ({time.perf_counter() - start:.0f}s); N = {plan.n_samples} against '{plan.sampler}', power "
                f"{plan.power:.3f}{'' if plan.has_power else f' (no power: needs N = {plan.n_needed})'}")
            start = time.perf_counter()
            fit = chi_square_gof(pair.samples(k, plan.n_samples, settings.seed), pair.exact)
            wrong_fit = chi_square_gof(pair.samples(k, plan.n_samples, settings.seed, SAMPLERS[plan.sampler]),
                                       pair.exact)
            log(f"  k={k}: chi2 {fit.chi2:.1f} / {fit.dof}, p {fit.p_value:.4f}; wrong sampler chi2 "
                f"{wrong_fit.chi2:.1f}, p {wrong_fit.p_value:.3g} ({time.perf_counter() - start:.0f}s)")
            rows.append({
                "prompt_id": prompt.prompt_id, "k": k, "n_samples": fit.n_samples, "chi2": fit.chi2,
                "dof": fit.dof, "p_value": fit.p_value, "impossible": fit.impossible,
                "wrong_sampler_chi2": wrong_fit.chi2, "wrong_sampler_p_value": wrong_fit.p_value,
                "n_outcomes": len(pair.exact), "n_prefixes": len(laws.prefixes), "n_kept_tokens": len(laws.kept),
                "wrong_sampler": plan.sampler, "tv_distance": plan.tv_distance, "power": plan.power,
                "has_power": plan.has_power, "n_needed": plan.n_needed, "planned_threshold": threshold,
                "target_power": settings.power, "sample_cap": settings.samples or settings.max_samples,
                "tv_by_sampler": "; ".join(f"{name}: {tv:.4g}" for name, tv in plan.tv_by_sampler.items()),
            })
    return rows
