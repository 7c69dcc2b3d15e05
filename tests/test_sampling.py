"""Unit tests of warping, the exact rejection step, the greedy step and their input checks."""

import numpy as np
import pytest
import scipy.stats
import torch

from specdec import sampling
from specdec.sampling import (
    SamplingConfig,
    acceptance_probability,
    greedy_step,
    residual_distribution,
    speculative_step,
    warp_logits,
)


def test_warp_temperature_matches_softmax():
    logits = torch.tensor([1.0, 2.0, 3.0, 0.5])
    probs = warp_logits(logits, SamplingConfig(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, dim=-1))


def test_warp_top_k_keeps_the_k_largest():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    probs = warp_logits(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, True, False, False]
    assert torch.allclose(probs[[1, 2]], torch.softmax(torch.tensor([4.0, 3.0]), dim=-1))


def test_warp_top_p_keeps_the_token_that_crosses_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    probs = warp_logits(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert (probs > 0).tolist() == [True, True, False, False]
    assert torch.allclose(probs[:2], torch.tensor([0.625, 0.375]))


def test_warp_top_p_on_batched_rows_is_per_row():
    logits = torch.tensor([[0.0, 0.0, 10.0], [10.0, 0.0, 0.0]])
    probs = warp_logits(logits, SamplingConfig(temperature=1.0, top_p=0.5))
    assert probs.argmax(dim=-1).tolist() == [2, 0]
    assert torch.allclose(probs.max(dim=-1).values, torch.ones(2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
        ({"temperature": 1.0, "top_k": 0}, "top_k"),
    ],
)
def test_sampling_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def _uniform(rows, vocab):
    return torch.full((rows, vocab), 1.0 / vocab)


@pytest.mark.parametrize(
    "p, q, tokens, message",
    [
        (_uniform(3, 4), _uniform(2, 4), torch.tensor([0, 1, 2]), "k \\+ 1"),
        (_uniform(3, 4), _uniform(1, 4), torch.tensor([0, 1]), "q has 1 rows"),
        (_uniform(3, 4), _uniform(2, 5), torch.tensor([0, 1]), "vocabulary mismatch"),
        (_uniform(1, 4), _uniform(0, 4), torch.tensor([], dtype=torch.long), "k = 0"),
        (torch.tensor([[0.5, 0.5, 0.1, -0.1]] * 2), _uniform(1, 4), torch.tensor([0]), "negative"),
        (torch.tensor([[0.5, float("nan"), 0.25, 0.25]] * 2), _uniform(1, 4), torch.tensor([0]), "NaN"),
        (torch.tensor([[0.5, 0.5, 0.5, 0.5]] * 2), _uniform(1, 4), torch.tensor([0]), "sums to"),
        (_uniform(2, 4), torch.tensor([[0.0, 0.5, 0.5, 0.0]]), torch.tensor([0]), "q = 0"),
        (_uniform(2, 4), _uniform(1, 4), torch.tensor([4]), "out of range"),
        (_uniform(2, 4), _uniform(1, 4), torch.tensor([[0]]), "1-D"),
    ],
)
def test_speculative_step_rejects_malformed_input(p, q, tokens, message):
    with pytest.raises(ValueError, match=message):
        speculative_step(p, q, tokens, torch.Generator().manual_seed(0))


def test_speculative_step_returns_python_ints_and_keeps_token_when_p_dominates():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.5, 0.5, 0.0]])
    n, token = speculative_step(p, q, torch.tensor([1]), torch.Generator().manual_seed(0))
    assert type(n) is int and type(token) is int
    assert n == 1  # p(x) = 1 >= q(x): always kept


def test_rejection_draws_from_the_residual():
    # The residual differs from p: p = (0.5, 0.3, 0.2), q drafted token 0 with q = (0.9, 0.05, 0.05), so a rejection
    # (probability 1 - 0.5/0.9) must be followed by normalise(max(0, p - q)) = (0, 0.625, 0.375), never token 0.
    # Drawing from p instead would put about half of the ~890 rejected draws on token 0.
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    q = torch.tensor([[0.9, 0.05, 0.05]], dtype=torch.float64)
    after_rejection = []
    for seed in range(2000):
        n, token = speculative_step(p, q, torch.tensor([0]), torch.Generator().manual_seed(seed))
        if n == 0:
            after_rejection.append(token)
    counts = np.bincount(after_rejection, minlength=3)
    assert 800 < counts.sum() < 980  # rejections happen at 1 - 5/9 = 0.444
    assert counts[0] == 0
    assert scipy.stats.chisquare(counts[1:], counts.sum() * np.array([0.625, 0.375])).pvalue > 1e-3


def test_acceptance_probability_is_min_one_p_over_q():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.9, 0.3, 0.1, 0.4])
    assert acceptance_probability(p, q).tolist() == pytest.approx([5 / 9, 1.0, 1.0, 0.0])
    assert acceptance_probability(p, q).dtype == torch.float64


@pytest.mark.parametrize("kept", [0.0, 1.0])
def test_the_step_decides_through_acceptance_probability(monkeypatch, kept):
    # The distribution check's laws call acceptance_probability and residual_distribution; this shows the engine's
    # step does too (replaced, the step follows), so the laws and the loop share one rule. p, q: kept at 5/9.
    monkeypatch.setattr(sampling, "acceptance_probability", lambda p_x, q_x: torch.full_like(p_x.double(), kept))
    monkeypatch.setattr(sampling, "residual_distribution", lambda p_row, q_row: torch.tensor([0.0, 0.0, 1.0]))
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    q = torch.tensor([[0.9, 0.05, 0.05]], dtype=torch.float64)
    steps = {speculative_step(p, q, torch.tensor([0]), torch.Generator().manual_seed(seed)) for seed in range(40)}
    if kept:
        assert {n for n, _ in steps} == {1}
    else:
        assert steps == {(0, 2)}  # always rejected, then the (replaced) residual's only token


def test_degenerate_residual_falls_back_to_p_without_nan():
    p = torch.tensor([0.25, 0.25, 0.5])
    q = p + torch.tensor([1e-12, -1e-12, 0.0])
    residual = residual_distribution(p, q)
    assert torch.isfinite(residual).all()
    assert torch.allclose(residual, p.double())


def test_degenerate_residual_in_a_step_returns_a_valid_token():
    # q equals p but for rounding-level mass on token 2, which p forbids: drafting token 2 is always rejected (p = 0)
    # and max(0, p - q) has no mass, so the step must fall back to p rather than return NaN or token 2.
    p = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5, 1e-12]], dtype=torch.float64)
    assert (p[0] - q[0]).clamp_min(0).sum() == 0  # the residual is degenerate
    tokens = []
    for seed in range(50):
        n, token = speculative_step(p, q, torch.tensor([2]), torch.Generator().manual_seed(seed))
        assert n == 0  # the rejection branch, every time
        tokens.append(token)
    assert set(tokens) == {0, 1}  # drawn from p: both of its tokens, never the forbidden one


def test_greedy_step_accepts_matching_prefix_then_emits_target_argmax():
    target_argmax = torch.tensor([5, 6, 7, 8])
    assert greedy_step(target_argmax, torch.tensor([5, 6, 9])) == (2, 7)
    assert greedy_step(target_argmax, torch.tensor([5, 6, 7])) == (3, 8)
    assert greedy_step(target_argmax, torch.tensor([1, 6, 7])) == (0, 5)
    with pytest.raises(ValueError, match="shape mismatch"):
        greedy_step(target_argmax, torch.tensor([5, 6]))


def test_argmax_is_torchs_first_maximum_for_every_layout_and_dtype():
    """sampling.argmax (numpy's for CPU float32) gives torch.argmax's index: ties to the first maximum, 1-d and 2-d,
    strided rows, and the dtypes that fall back to torch."""
    from specdec.sampling import argmax

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (7, 151), generator=g).float()  # many ties
    for logits in (x, x[3], x.t().contiguous().t(), x[:, ::2], x.to(torch.bfloat16), x.double()):
        got, want = argmax(logits), logits.argmax(dim=-1)
        assert torch.equal(got, want), (logits.dtype, tuple(logits.stride()))
    assert int(argmax(torch.tensor([1.0, 3.0, 3.0, 2.0]))) == 1  # the first of equal maxima
