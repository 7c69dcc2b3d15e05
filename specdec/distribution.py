"""Distributional exactness on a real pair: the exact target distribution over the first few generated tokens,
samples drawn through the study's own speculative loop, a chi-square test, and the same test on a wrong sampler.

Why it is cheap: with top-k warping the continuation space is small (top_k ** length sequences), and both models
sit behind PrefixMemoLM, so each distinct prefix costs one forward however many samples pass through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .decode import generate_speculative
from .drafts import ModelDraft
from .interleave import batch_of_one
from .lm import PrefixMemoLM
from .sampling import SamplingConfig, sample_from, warp_logits
from .stats import GoodnessOfFit, chi_square_gof


def residual_drawn_from_p(p, q, draft_tokens, generator):
    """Deliberately wrong rule: the acceptance test is right, but on rejection the token is drawn from p instead of
    normalise(max(0, p - q)). Its output over-weights tokens the draft likes; the check must reject it."""
    k = draft_tokens.shape[0]
    for i in range(k):
        x = int(draft_tokens[i])
        if torch.rand(1, generator=generator, dtype=torch.float64).item() * float(q[i, x]) >= float(p[i, x]):
            return i, sample_from(p[i].double(), generator)
    return k, sample_from(p[k].double(), generator)


WRONG_RULES: dict[str, Callable] = {"residual drawn from p": residual_drawn_from_p}


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


class SubVocabularySession:
    """A restricted PrefixMemoLM seen through small token ids: id i < n stands for kept[i]; an id n + t feeds token
    t of the full vocabulary unchanged (how the prompt, whose tokens are not kept, is passed in)."""

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


def _support(logits: torch.Tensor, sampling: SamplingConfig) -> list[int]:
    return torch.nonzero(warp_logits(logits, sampling)).flatten().tolist()


@dataclass(frozen=True)
class DistributionCheck:
    fit: GoodnessOfFit
    wrong_fit: GoodnessOfFit
    n_outcomes: int  # continuations with non-zero target probability
    n_prefixes: int  # prefixes the loop can visit, each one target and one draft forward
    n_kept_tokens: int  # tokens with non-zero probability under either model at any of those prefixes


class MemoisedPair:
    """Target and draft behind prefix memos for one prompt: the exact distribution of the first `length` tokens,
    and samples of them drawn by generate_speculative over the very same logits.

    Prefixes up to length - 1 generated tokens decide the compared tokens; deeper ones are answered from that depth
    (PrefixMemoLM.exact_depth). Every prefix the loop can visit is computed first: the first token comes from the
    target alone, so depth 1 holds the target's support; from there on a token may come from either model's
    support. Tokens outside the union of those supports have probability 0 under p and q alike, so the loop runs
    on that union (SubVocabularySession) and draws from exactly the same distributions, ~1000x cheaper per sample.
    """

    def __init__(self, target_model, draft_model, input_ids: torch.Tensor, sampling: SamplingConfig, length: int,
                 min_confidence: float | None = None):
        if sampling.greedy:
            raise ValueError("a distribution check needs temperature > 0")
        if sampling.top_k is None:
            raise ValueError("a distribution check enumerates continuations: it needs a top_k")
        self.length, self.sampling, self.min_confidence = length, sampling, min_confidence
        self.prompt = tuple(input_ids[0].tolist())
        self.target = PrefixMemoLM(target_model, exact_depth=length - 1)
        self.draft = PrefixMemoLM(draft_model, eos_token_ids=self.target.eos_token_ids, exact_depth=length - 1)
        self.exact = exact_first_tokens(self.target, self.prompt, sampling, length)
        prefixes = self._reachable_prefixes()
        kept: set[int] = set()
        for prefix in prefixes:
            kept.update(_support(self.target.next_token_logits(prefix), sampling))
            kept.update(_support(self.draft.next_token_logits(prefix), sampling))
        self.kept = sorted(kept)
        self.n_prefixes = len(prefixes)
        self.target.restrict(self.kept)
        self.draft.restrict(self.kept)

    def _reachable_prefixes(self) -> list[tuple[int, ...]]:
        root = self.prompt
        level = [root + (token,) for token in _support(self.target.next_token_logits(root), self.sampling)]
        prefixes = [root] + level
        for _ in range(2, self.length):
            level = [
                prefix + (token,)
                for prefix in level
                if prefix[-1] not in self.target.eos_token_ids
                for token in sorted(set(_support(self.target.next_token_logits(prefix), self.sampling))
                                    | set(_support(self.draft.next_token_logits(prefix), self.sampling)))
            ]
            prefixes += level
        return prefixes

    def samples(self, k: int, n_samples: int, seed: int = 0, rejection_rule=None) -> list[tuple[int, ...]]:
        """n_samples runs of generate_speculative (seeds seed, seed + 1, ...), first `length` tokens each, in full
        vocabulary ids. Each run goes on for k + 2 tokens so that its first draft block holds k tokens."""
        n = len(self.kept)
        target = SubVocabularySession(self.target, self.kept)
        draft = ModelDraft(SubVocabularySession(self.draft, self.kept), min_confidence=self.min_confidence)
        input_ids = torch.tensor([[n + token for token in self.prompt]])
        max_new_tokens = max(self.length, k + 2)
        out = []
        for i in range(n_samples):
            result = generate_speculative(
                target, draft, input_ids, k, max_new_tokens, self.sampling.temperature, self.sampling.top_k,
                self.sampling.top_p, seed=seed + i, rejection_rule=rejection_rule,
            )
            out.append(tuple(self.kept[t] for t in result.tokens[: self.length]))
        return out

    def check(self, k: int, n_samples: int, wrong_rule: str = "residual drawn from p",
              seed: int = 0) -> DistributionCheck:
        return DistributionCheck(
            fit=chi_square_gof(self.samples(k, n_samples, seed), self.exact),
            wrong_fit=chi_square_gof(self.samples(k, n_samples, seed, WRONG_RULES[wrong_rule]), self.exact),
            n_outcomes=len(self.exact),
            n_prefixes=self.n_prefixes,
            n_kept_tokens=len(self.kept),
        )


@dataclass(frozen=True)
class DistributionSettings:
    """The verify_distribution stage's settings (config key distribution_check)."""

    temperature: float = 1.0
    top_k: int = 5
    tokens: int = 3
    samples: int = 10_000
    k: tuple[int, ...] = (1, 4)
    prompts_per_domain: int = 2
    seed: int = 0


def run_distribution_checks(target_model, draft_model, prompts, settings: DistributionSettings,
                            min_confidence: float | None = None, log=print) -> list[dict]:
    """One row per (prompt, k): the chi-square fit of the speculative samples and of a wrong sampler's samples
    against the exact target distribution over the first settings.tokens tokens. min_confidence: the draft's
    adaptive stop (see ModelDraft), checked like any other draft."""
    sampling = SamplingConfig(settings.temperature, settings.top_k, None)
    rows = []
    for prompt in prompts.head(settings.prompts_per_domain).itertuples(index=False):
        input_ids = batch_of_one(prompt.input_ids)
        start = time.perf_counter()
        pair = MemoisedPair(target_model, draft_model, input_ids, sampling, settings.tokens, min_confidence)
        log(f"{prompt.prompt_id}: {len(pair.exact)} continuations, {pair.n_prefixes} prefixes, "
            f"{len(pair.kept)} kept tokens ({time.perf_counter() - start:.0f}s of forwards)")
        for k in settings.k:
            start = time.perf_counter()
            check = pair.check(k, settings.samples, seed=settings.seed)
            log(f"  k={k}: chi2 {check.fit.chi2:.1f} / {check.fit.dof}, p {check.fit.p_value:.4f}; wrong sampler "
                f"chi2 {check.wrong_fit.chi2:.1f}, p {check.wrong_fit.p_value:.3g} ({time.perf_counter() - start:.0f}s)")
            rows.append(dict(
                prompt_id=prompt.prompt_id, k=k, n_samples=check.fit.n_samples, chi2=check.fit.chi2,
                dof=check.fit.dof, p_value=check.fit.p_value, impossible=check.fit.impossible,
                wrong_sampler_chi2=check.wrong_fit.chi2, wrong_sampler_p_value=check.wrong_fit.p_value,
                n_outcomes=check.n_outcomes, n_prefixes=check.n_prefixes, n_kept_tokens=check.n_kept_tokens,
            ))
    return rows
