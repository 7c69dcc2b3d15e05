"""Unit tests of warping, the exact rejection step, the greedy step and their input checks."""

import pytest
import torch

from specdec.sampling import (
    SamplingConfig,
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
    # p puts no mass where q drafted, so the draft is always rejected and the residual is {2: 1}.
    p = torch.tensor([[0.0, 0.0, 1.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    for seed in range(20):
        assert speculative_step(p, q, torch.tensor([0]), torch.Generator().manual_seed(seed)) == (0, 2)


def test_degenerate_residual_falls_back_to_p_without_nan():
    p = torch.tensor([0.25, 0.25, 0.5])
    q = p + torch.tensor([1e-12, -1e-12, 0.0])
    residual = residual_distribution(p, q)
    assert torch.isfinite(residual).all()
    assert torch.allclose(residual, p.double())


def test_degenerate_residual_in_a_step_returns_a_valid_token():
    # q = p exactly: acceptance is certain, but force the rejection branch through a token p rates below q by
    # rounding only; whatever happens the answer must be a token with p > 0.
    p = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.5 + 1e-13, 0.5 - 1e-13, 0.0]], dtype=torch.float64)
    for seed in range(50):
        n, token = speculative_step(p, q, torch.tensor([0]), torch.Generator().manual_seed(seed))
        assert token in (0, 1)


def test_greedy_step_accepts_matching_prefix_then_emits_target_argmax():
    target_argmax = torch.tensor([5, 6, 7, 8])
    assert greedy_step(target_argmax, torch.tensor([5, 6, 9])) == (2, 7)
    assert greedy_step(target_argmax, torch.tensor([5, 6, 7])) == (3, 8)
    assert greedy_step(target_argmax, torch.tensor([1, 6, 7])) == (0, 5)
    with pytest.raises(ValueError, match="shape mismatch"):
        greedy_step(target_argmax, torch.tensor([5, 6]))
