"""Distributional exactness above temperature 0, by chi-square tests that are shown able to fail.

Every correct-sampler test in this file is one of FAMILY_SIZE hypotheses; each is judged at the Bonferroni
threshold ALPHA / FAMILY_SIZE (family-wise error 1%). A wrong sampler counts as rejected when its p-value is
below that same threshold at the same sample size. Seeds are fixed, so the p-values are reproducible.
"""

import itertools

import pytest
import torch

from specdec import sampling
from specdec.decode import generate_speculative
from specdec.distribution import MemoisedPair, residual_drawn_from_p
from specdec.lm import PrefixMemoLM
from specdec.sampling import SamplingConfig, speculative_step, warp_logits
from specdec.stats import chi_square_gof
from specdec.testing import perturbed_copy, tiny_qwen2

ALPHA = 0.01
FAMILY_SIZE = 9  # 5 one-step (p, q) pairs + 2 end-to-end settings + 2 memoised-pair checks (fp32 and bf16 draft)
THRESHOLD = ALPHA / FAMILY_SIZE
ONE_STEP_SAMPLES = 20_000
END_TO_END_SAMPLES = 20_000
V = 5
LENGTH = 3  # tokens per one-step sequence: positions 0..2
K = 2


# --- wrong samplers: each breaks one piece of the rule -------------------------------------------------------------
residual_from_p = residual_drawn_from_p  # the study's own wrong sampler (specdec.distribution)


def ratio_inverted(p, q, draft_tokens, generator):
    """Wrong: accept with min(1, q/p)."""
    k = draft_tokens.shape[0]
    for i in range(k):
        x = int(draft_tokens[i])
        if torch.rand(1, generator=generator, dtype=torch.float64).item() * p[i, x] >= q[i, x]:
            return i, sampling.sample_from(sampling.residual_distribution(p[i], q[i]), generator)
    return k, sampling.sample_from(p[k].double(), generator)


def accept_when_q_positive(p, q, draft_tokens, generator):
    """Wrong: keep every draft token that q could produce (i.e. all of them)."""
    k = draft_tokens.shape[0]
    return k, sampling.sample_from(p[k].double(), generator)


WRONG_SAMPLERS = {
    "residual drawn from p": residual_from_p,
    "acceptance min(1, q/p)": ratio_inverted,
    "accept whenever q > 0": accept_when_q_positive,
}


# --- one step, over a context-free "model": position j has target p_j and draft q_j --------------------------------
def _normalise(t):
    return t / t.sum(dim=-1, keepdim=True)


def _pairs():
    g = torch.Generator().manual_seed(11)
    rand = lambda: _normalise(torch.rand(LENGTH, V, generator=g, dtype=torch.float64) ** 2)
    one_hot = lambda token: torch.nn.functional.one_hot(torch.full((LENGTH,), token), V).double()
    p_random = rand()
    disjoint_p = _normalise(torch.tensor([[1.0, 2.0, 0.0, 0.0, 0.0]] * LENGTH, dtype=torch.float64))
    disjoint_q = _normalise(torch.tensor([[0.0, 0.0, 1.0, 1.0, 3.0]] * LENGTH, dtype=torch.float64))
    low_p = _normalise(torch.tensor([[0.6, 0.25, 0.1, 0.04, 0.01]] * LENGTH, dtype=torch.float64))
    return {
        "random": (p_random, rand()),
        "disjoint supports": (disjoint_p, disjoint_q),
        "q = p": (p_random, p_random.clone()),
        "q one-hot on a low-p token": (low_p, one_hot(4)),
        "p one-hot": (one_hot(1), rand()),
    }


def _sample_sequence(p, q, step, generator):
    """Run the speculative loop over LENGTH positions with blocks of up to K draft tokens."""
    out = []
    while len(out) < LENGTH:
        j = len(out)
        d = min(K, LENGTH - 1 - j)
        if d == 0:
            out.append(sampling.sample_from(p[j], generator))
            continue
        drafts = torch.stack([torch.multinomial(q[j + i], 1, generator=generator)[0] for i in range(d)])
        n, nxt = step(p[j : j + d + 1], q[j : j + d], drafts, generator)
        out += drafts[:n].tolist() + [nxt]
    return tuple(out[:LENGTH])


def _exact_sequences(p):
    return {
        seq: float(torch.prod(torch.stack([p[j, t] for j, t in enumerate(seq)])))
        for seq in itertools.product(range(V), repeat=LENGTH)
    }


def _one_step_fit(p, q, step, seed=0):
    generator = torch.Generator().manual_seed(seed)
    samples = [_sample_sequence(p, q, step, generator) for _ in range(ONE_STEP_SAMPLES)]
    return chi_square_gof(samples, _exact_sequences(p))


@pytest.mark.parametrize("pair", list(_pairs()))
def test_one_step_distribution_matches_target(pair):
    p, q = _pairs()[pair]
    fit = _one_step_fit(p, q, speculative_step)
    print(f"{pair}: chi2={fit.chi2:.2f} dof={fit.dof} p={fit.p_value:.4f}")
    assert fit.impossible == 0
    assert fit.p_value > THRESHOLD


@pytest.mark.parametrize("wrong", list(WRONG_SAMPLERS))
def test_one_step_test_rejects_wrong_sampler(wrong):
    p, q = _pairs()["random"]
    fit = _one_step_fit(p, q, WRONG_SAMPLERS[wrong])
    print(f"{wrong}: chi2={fit.chi2:.2f} dof={fit.dof} p={fit.p_value:.3g}")
    assert fit.p_value < THRESHOLD


# --- end to end: the real decoding loop on tiny models with an 8-token vocabulary ---------------------------------
E2E_VOCAB = 8
E2E_LENGTH = 3
PROMPT = torch.tensor([[1, 5, 2]])
SETTINGS = {"top-k 4": SamplingConfig(1.0, top_k=4, top_p=None), "top-p 0.8": SamplingConfig(1.0, None, 0.8)}


def _tiny_pair():
    target = tiny_qwen2(vocab_size=E2E_VOCAB, hidden_size=16, seed=3, init_std=0.3)
    draft = tiny_qwen2(vocab_size=E2E_VOCAB, hidden_size=16, seed=4, init_std=0.3)
    return PrefixMemoLM(target, eos_token_ids=()), PrefixMemoLM(draft, eos_token_ids=())


def _exact_continuations(target: PrefixMemoLM, config: SamplingConfig):
    prompt = tuple(PROMPT[0].tolist())
    exact = {}
    for seq in itertools.product(range(E2E_VOCAB), repeat=E2E_LENGTH):
        prob = 1.0
        for j in range(E2E_LENGTH):
            prob *= float(warp_logits(target.next_token_logits(prompt + seq[:j]), config)[seq[j]])
            if prob == 0.0:
                break
        exact[seq] = prob
    return exact


def _end_to_end_fit(config: SamplingConfig, k: int, rejection_rule=None):
    target, draft = _tiny_pair()
    exact = _exact_continuations(target, config)
    samples = [
        tuple(generate_speculative(target, draft, PROMPT, k, E2E_LENGTH, config.temperature, config.top_k,
                                   config.top_p, seed=seed, rejection_rule=rejection_rule).tokens)
        for seed in range(END_TO_END_SAMPLES)
    ]
    return chi_square_gof(samples, exact)


@pytest.mark.parametrize("setting, k", [("top-k 4", 2), ("top-p 0.8", 3)])
def test_end_to_end_distribution_matches_target(setting, k):
    fit = _end_to_end_fit(SETTINGS[setting], k)
    print(f"{setting} k={k}: chi2={fit.chi2:.2f} dof={fit.dof} p={fit.p_value:.4f}")
    assert fit.n_samples == END_TO_END_SAMPLES
    assert fit.impossible == 0
    assert fit.p_value > THRESHOLD


def test_end_to_end_test_rejects_wrong_sampler():
    fit = _end_to_end_fit(SETTINGS["top-k 4"], 2, rejection_rule=residual_from_p)
    print(f"residual drawn from p, end to end: chi2={fit.chi2:.2f} dof={fit.dof} p={fit.p_value:.3g}")
    assert fit.p_value < THRESHOLD


# --- the real-pair check's machinery (specdec.distribution), on a tiny pair with a realistic vocabulary ----------
MEMO_SAMPLES = 3_000


def _memoised_pair(k_tokens=3, draft_dtype=torch.float32):
    target = tiny_qwen2(vocab_size=512, hidden_size=16, seed=5, init_std=0.3)
    # overlapping supports, so rejections draw residuals; a bf16 draft is how the study runs a cheaper draft
    draft = perturbed_copy(target, noise=0.1, seed=6).to(draft_dtype)
    return MemoisedPair(target, draft, torch.tensor([[7, 300, 12, 45]]), SamplingConfig(1.0, top_k=5), k_tokens)


@pytest.mark.parametrize("draft_dtype", [torch.float32, torch.bfloat16], ids=["fp32-draft", "bf16-draft"])
def test_memoised_pair_samples_follow_the_target_and_reject_the_wrong_sampler(draft_dtype):
    pair = _memoised_pair(draft_dtype=draft_dtype)
    assert len(pair.exact) == 125 and abs(sum(pair.exact.values()) - 1.0) < 1e-9
    # the loop runs on the union of supports only: far fewer tokens than the vocabulary
    assert len(pair.kept) < 512
    check = pair.check(k=4, n_samples=MEMO_SAMPLES)
    print(f"memoised pair k=4: chi2={check.fit.chi2:.1f}/{check.fit.dof} p={check.fit.p_value:.4f}; wrong sampler "
          f"chi2={check.wrong_fit.chi2:.1f} p={check.wrong_fit.p_value:.3g}")
    assert check.fit.n_samples == MEMO_SAMPLES and check.fit.impossible == 0
    assert check.fit.p_value > THRESHOLD
    assert check.wrong_fit.p_value < THRESHOLD


def test_memoised_pair_sampler_is_the_real_loop():
    """k changes the samples (the first block drafts k tokens), and seeds reproduce them."""
    pair = _memoised_pair()
    assert pair.samples(4, 50, seed=1) == pair.samples(4, 50, seed=1)
    assert pair.samples(1, 200, seed=1) != pair.samples(4, 200, seed=1)


def test_prefix_memo_matches_fresh_forwards_and_caps_depth():
    model = tiny_qwen2(vocab_size=64, hidden_size=16, seed=2)
    memo = PrefixMemoLM(model, exact_depth=1)
    prompt = [3, 9, 4]
    memo.reset()
    memo.extend(prompt, 1)
    deep = memo.extend([5, 6, 7], 3)  # depths 1, 2, 3 after the prompt
    with torch.inference_mode():
        fresh = model(input_ids=torch.tensor([prompt + [5, 6, 7]])).logits[0].float()
    torch.testing.assert_close(deep[0], fresh[3])  # depth 1: exact
    torch.testing.assert_close(deep[1], fresh[3])  # deeper: the depth-1 ancestor's logits
    torch.testing.assert_close(deep[2], fresh[3])
    memo.crop(3)
    again = memo.extend([8], 1)  # a new branch from the prompt: computed after rolling the KV cache back
    with torch.inference_mode():
        torch.testing.assert_close(again[0], model(input_ids=torch.tensor([prompt + [8]])).logits[0, -1].float())


def test_restricted_memo_refuses_unknown_prefixes():
    memo = PrefixMemoLM(tiny_qwen2(vocab_size=64, hidden_size=16, seed=2))
    memo.next_token_logits((1, 2, 3))
    memo.restrict([0, 5, 9])
    assert memo.vocab_size == 3 and memo.next_token_logits((1, 2)).shape == (3,)
    with pytest.raises(KeyError, match="not memoised"):
        memo.next_token_logits((1, 2, 4))
