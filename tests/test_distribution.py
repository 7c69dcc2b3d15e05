"""Distributional exactness above temperature 0, by chi-square tests that are shown able to fail.

Every correct-sampler test in this file is one of FAMILY_SIZE hypotheses; each is judged at the Bonferroni
threshold ALPHA / FAMILY_SIZE (family-wise error 1%). A wrong sampler counts as rejected when its p-value is
below that same threshold at the same sample size. Seeds are fixed, so the p-values are reproducible.
"""

import copy
import itertools
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as scipy_stats
from scipy.optimize import brentq

from specdec.gguf import quant

from specdec import sampling
from specdec.decode import generate_speculative
from specdec.drafts import hybrid as hybrid_draft
from specdec.drafts.feature_head import FeatureHeadDraft, untrained_head
from specdec.gguf.model import read_gguf
from specdec.gguf.lean import LeanLM
from specdec.lm import PrefixMemoLM
from specdec.sampling import SamplingConfig, speculative_step, warp_logits
from specdec.study.report.analysis import judge_distribution_checks
from specdec.study.verify.distribution import (
    HybridLaw,
    MemoisedHeadDraft,
    EXACT,
    SAMPLERS,
    MemoisedPair,
    check_exact_law,
    plan_test,
    residual_drawn_from_p,
    run_distribution_checks,
)
from specdec.study.verify.distribution_verdict import DistributionSettings, failure_messages
from specdec.study.verify.distribution import (
    WRONG_SAMPLERS as STUDY_WRONG_SAMPLERS,
)
from specdec.study.stats import chi_square_gof, chi_square_power, samples_for_power, total_variation
from specdec.testing import perturbed_copy, tiny_gguf, tiny_qwen2
from scripts import load_script


ALPHA = 0.01
FAMILY_SIZE = 9  # 5 one-step (p, q) pairs + 2 end-to-end settings + 2 memoised-pair checks (fp32 and bf16 draft)
THRESHOLD = ALPHA / FAMILY_SIZE
# Sized to the suite's budget: at 3,000 samples the subtlest wrong sampler below (the residual drawn from p) is still
# rejected by a chi-square of 767 on 54 degrees of freedom one step at a time (p ~ 1e-126) and of 348 on 50 end to
# end (p ~ 1e-46), the others by 13,500+ (measured 2026-12-01; at 8,000 and 20,000 samples the margins only grew).
ONE_STEP_SAMPLES = 3_000
END_TO_END_SAMPLES = 3_000
V = 5
LENGTH = 3  # tokens per one-step sequence: positions 0..2
K = 2


# --- wrong samplers: each breaks one piece of the rule -------------------------------------------------------------
residual_from_p = residual_drawn_from_p  # the study's own wrong sampler (specdec.study.verify.distribution)


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


# --- the real-pair check's machinery (specdec.study.verify.distribution), on a tiny pair with a realistic vocabulary --
MEMO_SAMPLES = 3_000


def _memoised_pair(k_tokens=3, draft_dtype=torch.float32):
    target = tiny_qwen2(vocab_size=512, hidden_size=16, seed=5, init_std=0.3)
    # overlapping supports, so rejections draw residuals; a bf16 draft is how the study runs a cheaper draft
    draft = perturbed_copy(target, noise=0.1, seed=6).to(draft_dtype)
    return MemoisedPair(target, draft, torch.tensor([[7, 300, 12, 45]]), SamplingConfig(1.0, top_k=5), k_tokens)


@pytest.mark.slow  # the study's check machinery on a tiny pair; the rule's own chi-square tests stay in the fast tier
@pytest.mark.parametrize("draft_dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.extended)],
                         ids=["fp32-draft", "bf16-draft"])  # bf16: the same machinery again, in the extended runs
def test_memoised_pair_samples_follow_the_target_and_reject_the_wrong_sampler(draft_dtype):
    pair = _memoised_pair(draft_dtype=draft_dtype)
    assert len(pair.exact) == 125 and abs(sum(pair.exact.values()) - 1.0) < 1e-9
    check = pair.check(k=4, n_samples=MEMO_SAMPLES)
    # the loop runs on the union of supports (and the prompt's tokens) only: far fewer tokens than the vocabulary
    assert len(pair.kept) < 512
    print(f"memoised pair k=4: chi2={check.fit.chi2:.1f}/{check.fit.dof} p={check.fit.p_value:.4f}; wrong sampler "
          f"chi2={check.wrong_fit.chi2:.1f} p={check.wrong_fit.p_value:.3g}")
    assert check.fit.n_samples == MEMO_SAMPLES and check.fit.impossible == 0
    assert check.fit.p_value > THRESHOLD
    assert check.wrong_fit.p_value < THRESHOLD


@pytest.mark.slow  # as the pair above: the study's check machinery, here over the GGUF engine's sessions
@pytest.mark.skipif(not quant.available(), reason="specdec.native._quant (the quantized product) not built")
def test_the_check_runs_on_gguf_sessions_and_rejects_the_wrong_sampler(tmp_path):
    """The GGUF regime's sessions (LeanLM) behind the prefix memos, as verify_distribution runs them there: a tiny
    GGUF target and, as its draft, a session over its first layer (a truncated cut of the same file)."""
    model = read_gguf(tiny_gguf(tmp_path / "target.gguf", norm_scale=(0.3, 0.1)))
    target, draft = LeanLM(model, max_length=32), LeanLM(model, max_length=32, layers=1)
    pair = MemoisedPair(target, draft, torch.tensor([[7, 30, 12, 45]]), SamplingConfig(1.0, top_k=5), 3)
    assert len(pair.exact) > 100 and abs(sum(pair.exact.values()) - 1.0) < 1e-9  # up to 125 (EOS ends some)
    check = pair.check(k=3, n_samples=MEMO_SAMPLES)
    assert check.fit.n_samples == MEMO_SAMPLES and check.fit.impossible == 0
    assert check.fit.p_value > THRESHOLD, check.fit
    assert check.wrong_fit.p_value < THRESHOLD, check.wrong_fit


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


def test_prefix_memo_depth_counts_from_the_given_prompt_length():
    """A user that defers its prompt pass feeds prompt + generated tokens first: the depth cap must still count from
    the prompt (prompt_length), not from that first, longer sequence."""
    model = tiny_qwen2(vocab_size=64, hidden_size=16, seed=2)
    prompt, generated = [3, 9, 4], [5, 6, 7]
    with torch.inference_mode():
        fresh = model(input_ids=torch.tensor([prompt + generated])).logits[0].float()
    fixed = PrefixMemoLM(model, exact_depth=1, prompt_length=len(prompt))
    fixed.reset()
    late = fixed.extend(prompt + generated, 3)  # depths 1, 2, 3 after the prompt, in one first call
    for row in late:
        torch.testing.assert_close(row, fresh[3])  # all answered at depth 1, as after an eager prompt pass
    first_call = PrefixMemoLM(model, exact_depth=1)
    first_call.reset()
    assert not torch.allclose(first_call.extend(prompt + generated, 1)[0], fresh[3])  # the old root: too deep
    with pytest.raises(ValueError, match="prompt_length"):
        PrefixMemoLM(model, prompt_length=0)


def test_restricted_memo_refuses_unknown_prefixes():
    memo = PrefixMemoLM(tiny_qwen2(vocab_size=64, hidden_size=16, seed=2))
    memo.next_token_logits((1, 2, 3))
    memo.restrict([0, 5, 9])
    assert memo.vocab_size == 3 and memo.next_token_logits((1, 2)).shape == (3,)
    with pytest.raises(KeyError, match="not memoised"):
        memo.next_token_logits((1, 2, 4))


# --- exact laws of the loop's output (the dynamic program), power and N, outcomes (issue 16) -----------------------
# The fast tier's two fits of a wrong sampler's samples to its law form a family of their own (the slow tier's 18
# fits another).
LAW_FAMILY = 2
LAW_THRESHOLD = ALPHA / LAW_FAMILY
LAW_VOCAB = 16
LAW_SAMPLING = SamplingConfig(1.0, top_k=3)
DRAFT_SPECS = {
    "model": {"kind": "model", "model": "d"},
    "adaptive": {"kind": "model", "model": "d", "min_confidence": 0.4},
    "hybrid": {"kind": "hybrid", "model": "d", "ngram_max": 2},
    "hybrid-adaptive": {"kind": "hybrid", "model": "d", "ngram_max": 2, "min_confidence": 0.4},
    # lookup's blocks to k, the model's to one token, its prompt pass eager
    "hybrid-model-k": {"kind": "hybrid", "model": "d", "ngram_max": 2, "model_k": 1, "defer_prefill": False},
    "lookup": {"kind": "prompt_lookup"},
    # a model draft that reads only the prompt's last 3 of its 13 tokens (prompt_window), alone and in a hybrid
    "windowed": {"kind": "model", "model": "d", "prompt_window": 3},
    "hybrid-windowed": {"kind": "hybrid", "model": "d", "ngram_max": 2, "prompt_window": 3},
    # a feature head (its q depends on where its block began: laws and samples by block state, MemoisedHeadDraft)
    # drafting 11 of the 16 tokens, alone and behind prompt lookup
    "head": {"kind": "feature_head"},
    "head-hybrid": {"kind": "feature_head", "lookup": True, "ngram_max": 2},
}
HEAD_VOCAB = [0, 1, 2, 3, 4, 7, 9, 10, 12, 13, 15]


def _law_models(noise=0.3):
    """Target, draft and a prompt that repeats the target's greedy continuation of its start (so prompt lookup finds
    matches); the EOS token is one the target may draw first, so that some sequences end early."""
    target = tiny_qwen2(vocab_size=LAW_VOCAB, hidden_size=16, seed=5, init_std=0.3)
    start = [7, 2, 12, 4]
    with torch.inference_mode():
        out = target.generate(torch.tensor([start]), max_new_tokens=4, do_sample=False)[0].tolist()
        prompt = out + start + out[len(start):len(start) + 1]
        first = warp_logits(target(input_ids=torch.tensor([prompt])).logits[0, -1].float(), LAW_SAMPLING)
    eos = int(torch.nonzero(first).flatten()[torch.argmin(first[first > 0])])  # the least likely first token
    target.generation_config.eos_token_id = eos
    draft = perturbed_copy(target, noise=noise, seed=6)
    return target, draft, torch.tensor([prompt]), eos


def _law_pair(spec_name, length=3, noise=0.3):
    target, draft, prompt, eos = _law_models(noise)
    spec = DRAFT_SPECS[spec_name]
    if spec["kind"] == "feature_head":
        draft = untrained_head(target, HEAD_VOCAB, seed=8)
    pair = MemoisedPair(target, None if spec["kind"] == "prompt_lookup" else draft, prompt, LAW_SAMPLING, length,
                        draft_spec=spec)
    assert pair.target.eos_token_ids == {eos}
    return pair


@pytest.mark.parametrize("spec_name", list(DRAFT_SPECS))
def test_exact_rule_law_is_the_target_law(spec_name):
    """The dynamic program with the exact rule reproduces the target's own law, for every proposer and k (budgets
    cut by max_new_tokens, EOS inside the support, adaptive stops, lookup blocks); the wrong rules' laws are laws."""
    pair = _law_pair(spec_name)
    eos, = pair.target.eos_token_ids
    assert any(len(sequence) < 3 and sequence[-1] == eos for sequence in pair.exact)  # EOS ends some
    for k in (1, 2, 4):
        laws = pair.laws(k)
        assert total_variation(laws.by_sampler[EXACT.name], pair.exact) < 1e-12
        check_exact_law(pair, k)
        for sampler in STUDY_WRONG_SAMPLERS:
            assert abs(sum(laws.by_sampler[sampler.name].values()) - 1.0) < 1e-12
    if spec_name == "hybrid":  # the lookup blocks change the wrong rules' laws: the proposer's law is not ignored
        model = _law_pair("model")
        assert total_variation(pair.laws(4).by_sampler[STUDY_WRONG_SAMPLERS[0].name],
                               model.laws(4).by_sampler[STUDY_WRONG_SAMPLERS[0].name]) > 1e-3


# The mutations of the engine's rule the law must follow: each turns the exact rule into one of the study's wrong
# samplers, whose law the dynamic program computes with its own (unchanged) functions.
ENGINE_MUTATIONS = {
    "residual_distribution": (lambda p_row, q_row: p_row.double() / p_row.double().sum(), "residual drawn from p"),
    "acceptance_probability": (lambda p_x, q_x: torch.ones_like(p_x.double()), "every draft token accepted"),
}


@pytest.mark.parametrize("function", list(ENGINE_MUTATIONS))
def test_the_exact_law_follows_the_engines_rule(monkeypatch, function):
    """The exact rule's law is computed by specdec.sampling's own functions, not by a copy: with one of them replaced
    by a wrong one in the engine, the 'exact' law becomes that wrong sampler's and the check above fails."""
    wrong, sampler = ENGINE_MUTATIONS[function]
    expected = _law_pair("hybrid").laws(4).by_sampler[sampler]
    assert total_variation(expected, _law_pair("hybrid").exact) > 1e-3  # the mutation is visible at all
    monkeypatch.setattr(sampling, function, wrong)
    mutated = _law_pair("hybrid")
    assert total_variation(mutated.laws(4).by_sampler[EXACT.name], expected) < 1e-12
    with pytest.raises(RuntimeError, match="does not mirror"):
        check_exact_law(mutated, 4)
    with pytest.raises(AssertionError):
        test_exact_rule_law_is_the_target_law("hybrid")


def test_the_hybrid_law_and_the_hybrid_draft_follow_the_engines_policy(monkeypatch):
    """The hybrid's law and HybridDraft decide lookup-or-model through one function (drafts.hybrid): with it replaced
    by 'always the model', both follow: the law becomes the model draft's, and a block lookup would draft (the
    prompt ends in a repeat) comes from the model."""
    pair, model = _law_pair("hybrid"), _law_pair("model")
    name = STUDY_WRONG_SAMPLERS[0].name

    def first_block(pair):
        proposer = pair._proposer(pair.target, pair.draft)
        proposer.prefill(list(pair.prompt))
        return proposer.propose(list(pair.prompt), 2, LAW_SAMPLING, torch.Generator().manual_seed(0))

    assert total_variation(pair.laws(4).by_sampler[name], model.laws(4).by_sampler[name]) > 1e-3
    lookup_block = first_block(pair)
    assert lookup_block.tokens and (lookup_block.q.max(dim=-1).values == 1.0).all()  # lookup's point masses
    monkeypatch.setattr(hybrid_draft, "lookup_drafts_block", lambda lookup_tokens: False)
    mutated = _law_pair("hybrid")
    assert total_variation(mutated.laws(4).by_sampler[name], model.laws(4).by_sampler[name]) < 1e-12
    assert first_block(mutated).q.max(dim=-1).values.max() < 1.0  # the model's warped distributions


def test_the_hybrid_law_caps_the_models_blocks_as_the_hybrid_draft_does():
    """With model_k 1, a block the model drafts stops after one token in the law as in HybridDraft, while lookup's
    blocks run to k; the cap changes the law (a wrong sampler's), so the law does not ignore it."""
    pair, uncapped = _law_pair("hybrid-model-k"), _law_pair("hybrid")
    name = STUDY_WRONG_SAMPLERS[0].name
    assert total_variation(pair.laws(4).by_sampler[name], uncapped.laws(4).by_sampler[name]) > 1e-3
    proposer = pair._proposer(pair.target, pair.draft)
    law = HybridLaw(proposer, LAW_SAMPLING)
    prompt = tuple(int(t) for t in pair.prompt)
    proposer.prefill(list(prompt))
    generator = torch.Generator().manual_seed(0)
    repeat = next(prompt[:n] for n in range(2, len(prompt)) if len(proposer.lookup.lookup(prompt[:n], 4)) > 1)
    lookup_block = proposer.propose(list(repeat), 4, LAW_SAMPLING, generator)
    assert len(lookup_block.tokens) > 1 and law.next(repeat, tuple(lookup_block.tokens[:1]), 4) is not None
    context = prompt + (min(set(range(LAW_VOCAB)) - set(prompt)),)  # a token new to the context: the model drafts
    assert not proposer.lookup.lookup(list(context), 4)
    model_block = proposer.propose(list(context), 4, LAW_SAMPLING, generator)
    assert len(model_block.tokens) == 1 and model_block.q.max() < 1.0
    first = law.next(context, (), 4)
    assert first is not None and law.next(context, (model_block.tokens[0],), 4) is None


MC_SAMPLES = 4_000


def test_the_memoised_head_proposes_what_the_head_proposes():
    """The check's head (logits by block state from a fresh cache, memoised) draws the same tokens from the same q
    as the proposer the decode jobs run, from the same state and seed; on the reduced vocabulary of the samples it
    draws the same tokens (as reduced ids) from the same q restricted."""
    pair, (target, _, _, eos) = _law_pair("head"), _law_models()
    context = list(pair.prompt) + [3, 9]
    real = FeatureHeadDraft(untrained_head(target, HEAD_VOCAB, seed=8), target, eos_token_ids=[eos])
    real.prefill(context[:-1])
    expected = real.propose(context, 3, LAW_SAMPLING, torch.Generator().manual_seed(4))
    memo = MemoisedHeadDraft(pair.heads.head)  # every state computed (no compared depth)
    got = memo.propose(context, 3, LAW_SAMPLING, torch.Generator().manual_seed(4))
    assert got.tokens == expected.tokens
    torch.testing.assert_close(got.q, expected.q, rtol=0, atol=1e-6)
    off = next(t for t in range(LAW_VOCAB) if t not in HEAD_VOCAB and t not in context)  # never drafted
    kept = sorted(set(range(LAW_VOCAB)) - {off})
    reduced = memo.restricted(kept).propose([kept.index(t) for t in context], 3, LAW_SAMPLING,
                                            torch.Generator().manual_seed(4))
    assert [kept[t] for t in reduced.tokens] == expected.tokens
    torch.testing.assert_close(reduced.q, expected.q[:, kept], rtol=0, atol=1e-6)
    # the check's head (3 compared tokens): this block starts at generated token 2, so only its first draft token is
    # compared; the later ones are drawn from the first block's state (prompt and first generated token)
    cut = pair.heads.propose(context, 3, LAW_SAMPLING, torch.Generator().manual_seed(4))
    assert cut.tokens[0] == expected.tokens[0]
    first_block = warp_logits(memo.scores(tuple(pair.prompt) + (3,), ()), LAW_SAMPLING)
    assert len(cut.q) > 1 and all(torch.equal(row, first_block) for row in cut.q[1:])


@pytest.mark.parametrize("spec_name", ["head", "head-hybrid"])
def test_a_feature_heads_samples_fit_the_target_law_and_a_wrong_sampler_is_rejected(spec_name):
    """The check runs a feature head: samples through the real loop with the exact rule fit the target's law; the
    same number with a wrong rule are rejected (the laws say how far apart: the test can fail)."""
    pair = _law_pair(spec_name)
    fit = chi_square_gof(pair.samples(2, MC_SAMPLES, seed=3), pair.exact)
    wrong_name = STUDY_WRONG_SAMPLERS[1].name  # every draft token accepted: an untrained head is often wrong
    wrong = chi_square_gof(pair.samples(2, MC_SAMPLES, seed=3, rejection_rule=SAMPLERS[wrong_name]), pair.exact)
    print(f"{spec_name}: exact chi2 {fit.chi2:.1f}/{fit.dof} p {fit.p_value:.3f}; {wrong_name} p {wrong.p_value:.3g} "
          f"(TV {total_variation(pair.laws(2).by_sampler[wrong_name], pair.exact):.3f})")
    assert fit.impossible == 0 and fit.p_value > LAW_THRESHOLD
    assert wrong.p_value < LAW_THRESHOLD


@pytest.mark.parametrize("sampler", [s.name for s in STUDY_WRONG_SAMPLERS])
def test_wrong_sampler_law_matches_the_wrong_sampler(sampler):
    """Samples of the wrong sampler through the real loop (adaptive model draft, k = 2: blocks of 2, then of 1 as
    max_new_tokens runs out) fit the law the dynamic program gives it. The same samples reject the target's law and
    the law of the same sampler at k = 1 (another block structure): this comparison can fail."""
    pair = _law_pair("adaptive")
    law = pair.laws(2).by_sampler[sampler]
    samples = pair.samples(2, MC_SAMPLES, seed=7, rejection_rule=SAMPLERS[sampler])
    fit = chi_square_gof(samples, law)
    print(f"{sampler}: TV to target {total_variation(law, pair.exact):.3f}, to k=1 law "
          f"{total_variation(law, pair.laws(1).by_sampler[sampler]):.3f}; chi2 {fit.chi2:.1f}/{fit.dof} "
          f"p {fit.p_value:.3f}")
    assert fit.impossible == 0 and fit.p_value > LAW_THRESHOLD
    assert chi_square_gof(samples, pair.exact).p_value < LAW_THRESHOLD
    assert chi_square_gof(samples, pair.laws(1).by_sampler[sampler]).p_value < LAW_THRESHOLD


@pytest.mark.parametrize("spec_name", ["windowed", "hybrid-windowed"])
def test_a_windowed_drafts_law_is_of_its_window_and_matches_the_loop(spec_name):
    """A draft with a prompt_window: the check computes its law from the prompt's last tokens, as the draft reads
    them. A wrong sampler's samples through the real loop fit that law and reject the law of the same draft over the
    whole prompt (the window changes the law: this comparison can fail); the exact rule's law is the target's."""
    pair, whole = _law_pair(spec_name), _law_pair(spec_name.replace("windowed", "model").replace("-model", ""))
    assert pair.draft_prompt == pair.prompt[-3:] and whole.draft_prompt == pair.prompt
    wrong = STUDY_WRONG_SAMPLERS[0].name
    law, whole_law = pair.laws(2).by_sampler[wrong], whole.laws(2).by_sampler[wrong]
    assert total_variation(pair.laws(2).by_sampler[EXACT.name], pair.exact) < 1e-12
    samples = pair.samples(2, MC_SAMPLES, seed=5, rejection_rule=SAMPLERS[wrong])
    fit, against_whole = chi_square_gof(samples, law), chi_square_gof(samples, whole_law)
    print(f"{spec_name}: TV to the whole prompt's law {total_variation(law, whole_law):.3f}; chi2 {fit.chi2:.1f}/"
          f"{fit.dof} p {fit.p_value:.3f}; against the whole prompt's law p {against_whole.p_value:.3g}")
    assert fit.impossible == 0 and fit.p_value > ALPHA
    assert against_whole.p_value < ALPHA


@pytest.mark.slow  # the model draft's in the full suite; the hybrid's and lookup's in the extended runs
@pytest.mark.parametrize("spec_name", [pytest.param("hybrid", marks=pytest.mark.extended),
                                       pytest.param("lookup", marks=pytest.mark.extended), "model", "head"])
def test_wrong_sampler_laws_match_the_loop_for_every_proposer(spec_name):
    pair = _law_pair(spec_name)
    for k in (1, 3):
        for sampler in (EXACT, *STUDY_WRONG_SAMPLERS):
            law = pair.laws(k).by_sampler[sampler.name]
            fit = chi_square_gof(pair.samples(k, 2_000, seed=11, rejection_rule=sampler), law)
            print(f"{spec_name} k={k} {sampler.name}: chi2 {fit.chi2:.1f}/{fit.dof} p {fit.p_value:.3f}")
            assert fit.p_value > ALPHA / 18


# --- power: N sized from the two exact laws ----------------------------------------------------------------------
POWER_FAMILY = 8  # the test is judged as one of 8, as in a small study
POWER_THRESHOLD = ALPHA / POWER_FAMILY


def _power_pair():
    """tokens 2, k 1: one draft token decides the second output. Flat tiny models, top-3: 9 outcomes."""
    target = tiny_qwen2(vocab_size=LAW_VOCAB, hidden_size=16, seed=5, init_std=0.05)
    draft = perturbed_copy(target, noise=0.1, seed=6)
    return MemoisedPair(target, draft, torch.tensor([[7, 3, 12, 4]]), LAW_SAMPLING, 2)


def _analytic(pair):
    """The wrong sampler's law by hand (k = 1, 2 tokens): second token min(p, q) + (1 - sum min(p, q)) p after the
    first; its TV distance to the target's law, and the N at which the noncentral chi-square power is 0.99."""
    prompt = pair.prompt
    dist = lambda memo, prefix: warp_logits(memo.next_token_logits(prompt + prefix), LAW_SAMPLING).double()
    p0 = dist(pair.target, ())
    wrong = {}
    for first in torch.nonzero(p0).flatten().tolist():
        p, q = dist(pair.target, (first,)), dist(pair.draft, (first,))
        p, q = p / p.sum(), q / q.sum()
        both = torch.minimum(p, q)
        second = both + (1 - both.sum()) * p
        for token in torch.nonzero(second).flatten().tolist():
            wrong[(first, token)] = float(p0[first] / p0.sum() * second[token])
    exact = pair.exact
    tv = 0.5 * sum(abs(wrong.get(o, 0.0) - exact.get(o, 0.0)) for o in set(wrong) | set(exact))
    delta = sum((wrong[o] - exact[o]) ** 2 / exact[o] for o in exact)
    dof = len(exact) - 1
    critical = scipy_stats.chi2.isf(POWER_THRESHOLD, dof)
    n = brentq(lambda n: scipy_stats.ncx2.sf(critical, dof, n * delta) - 0.99, 1, 1e7)
    return wrong, tv, n


def test_sample_size_is_the_analytic_one_and_rejects_the_wrong_sampler():
    pair = _power_pair()
    wrong_law = pair.laws(1).by_sampler[STUDY_WRONG_SAMPLERS[0].name]
    wrong, tv, n_analytic = _analytic(pair)
    assert total_variation(wrong, wrong_law) < 1e-12 and 0.02 < tv < 0.15
    assert min(pair.exact.values()) * n_analytic > 5  # no pooling at that N: the closed form applies
    plan = plan_test(pair.exact, {s.name: pair.laws(1).by_sampler[s.name] for s in STUDY_WRONG_SAMPLERS},
                     POWER_THRESHOLD, power=0.99, max_samples=100_000, min_samples=1)
    print(f"TV {tv:.4f}; N analytic {n_analytic:.1f}, chosen {plan.n_samples}, power {plan.power:.4f}")
    assert plan.sampler == STUDY_WRONG_SAMPLERS[0].name and plan.has_power
    assert abs(plan.n_samples - n_analytic) / n_analytic < 0.03 and plan.power >= 0.99
    assert chi_square_power(pair.exact, wrong_law, plan.n_samples - 1, POWER_THRESHOLD) < 0.99  # the smallest N
    # 40 seeded repetitions at that N, drawn from the wrong sampler's exact law (which the test above ties to the loop)
    rng = np.random.default_rng(0)
    outcomes = list(wrong_law)
    probs = np.array([wrong_law[o] for o in outcomes])
    rejected = 0
    for _ in range(40):
        counts = rng.multinomial(plan.n_samples, probs / probs.sum())
        samples = [o for o, c in zip(outcomes, counts) for _ in range(c)]
        rejected += chi_square_gof(samples, pair.exact).p_value < POWER_THRESHOLD
    assert rejected >= 38  # >= 95%
    # a cap below that N: no power, and the N it would need is reported
    capped = plan_test(pair.exact, {STUDY_WRONG_SAMPLERS[0].name: wrong_law}, POWER_THRESHOLD, 0.99,
                       max_samples=plan.n_samples // 2)
    assert not capped.has_power and capped.n_needed == plan.n_samples and capped.n_samples == plan.n_samples // 2


@pytest.mark.slow
@pytest.mark.extended  # 40 runs of the real loop; the full suite draws the 40 from the wrong sampler's exact law,
# which test_wrong_sampler_laws_match_the_loop_for_every_proposer ties to the loop
def test_at_the_chosen_n_the_real_wrong_sampler_is_rejected_in_40_repetitions():
    pair = _power_pair()
    plan = plan_test(pair.exact, {s.name: pair.laws(1).by_sampler[s.name] for s in STUDY_WRONG_SAMPLERS},
                     POWER_THRESHOLD)
    rejected = sum(
        chi_square_gof(pair.samples(1, plan.n_samples, seed=100_000 * (r + 1), rejection_rule=STUDY_WRONG_SAMPLERS[0]),
                       pair.exact).p_value < POWER_THRESHOLD
        for r in range(40))
    print(f"N {plan.n_samples}: {rejected}/40 rejected")
    assert rejected >= 38


def test_power_counts_impossible_samples_and_pools_like_the_test():
    exact = {"a": 0.5, "b": 0.3, "c": 0.2}
    assert chi_square_power(exact, exact, 1000, 0.01) == pytest.approx(0.01)
    # mass 0.01 on an impossible outcome: at least 1 - 0.99^n
    assert chi_square_power(exact, {"a": 0.49, "b": 0.3, "c": 0.2, "z": 0.01}, 500, 0.01) >= 1 - 0.99 ** 500
    # at n = 10 only 'a' has an expected count of 5: b and c pool into one cell, whose deviation is then invisible
    swapped = {"a": 0.5, "b": 0.2, "c": 0.3}
    assert chi_square_power(exact, swapped, 10, 0.01) == pytest.approx(0.01)
    assert chi_square_power(exact, swapped, 2000, 0.01) > 0.99
    assert samples_for_power(exact, exact, 0.01).n_needed is None


# --- outcomes: no power is reported, not failed; a family without power fails ----------------------------------------
def _prompts(pair_prompt):
    return pd.DataFrame({"prompt_id": ["p0"], "input_ids": [list(pair_prompt)]})


def _rows(draft_noise, domain, settings):
    target = tiny_qwen2(vocab_size=LAW_VOCAB, hidden_size=16, seed=5, init_std=0.05)
    draft = copy.deepcopy(target) if draft_noise is None else perturbed_copy(target, noise=draft_noise, seed=6)
    rows = pd.DataFrame(run_distribution_checks(target, draft, _prompts([7, 3, 12, 4]), settings, family_size=2,
                                                log=lambda message: None))
    rows.insert(0, "domain", domain)
    rows.insert(0, "draft", "d")
    return rows


NO_POWER_SETTINGS = DistributionSettings(top_k=3, tokens=2, k=(1,), prompts_per_domain=1, min_samples=200,
                                         max_samples=1000)


def test_a_draft_equal_to_the_target_gives_no_power_not_a_failure():
    equal = _rows(None, "prose", NO_POWER_SETTINGS)  # the wrong samplers are then exactly right
    row = equal.iloc[0]
    assert not row["has_power"] and row["tv_distance"] < 1e-12 and pd.isna(row["n_needed"])
    assert row["n_samples"] == NO_POWER_SETTINGS.max_samples
    powered = _rows(0.1, "prose", NO_POWER_SETTINGS)
    assert powered.iloc[0]["has_power"] and powered.iloc[0]["n_samples"] >= NO_POWER_SETTINGS.min_samples
    # one domain with a powered test and one without: "no power" is reported, nothing fails
    table = judge_distribution_checks(pd.concat([powered, equal], ignore_index=True), ALPHA)
    assert list(table["outcome"]) == ["pass", "no power"] and table["passed"].all()
    assert failure_messages(table) == []
    # no test of the (draft, domain) has power: the family fails, saying so and what to change
    alone = judge_distribution_checks(equal, ALPHA)
    assert list(alone["outcome"]) == ["no power"]
    message, = failure_messages(alone)
    assert "d/prose" in message and "no test with power" in message and "prompt p0, k=1" in message
    assert "TV distance 0" in message and "no N can tell them apart" in message
    assert "distribution_check.max_samples" in message
    # a share instead: half the tests must have power
    assert failure_messages(table, min_powered_share=0.5) == []
    assert "min_powered_share = 0.75" in failure_messages(table, min_powered_share=0.75)[0]


def test_failures_name_the_test_the_tv_distance_and_the_config_key():
    base = {"draft": "d", "domain": "code", "prompt_id": "p9", "k": 4, "n_samples": 5000, "chi2": 1.0, "dof": 3,
            "impossible": 0, "wrong_sampler": "residual drawn from p", "tv_distance": 0.0123, "power": 0.995,
            "has_power": True, "n_needed": 4000, "target_power": 0.99}
    checks = pd.DataFrame([
        {**base, "p_value": 0.5, "wrong_sampler_p_value": 0.3},  # powered, wrong sampler not rejected
        {**base, "prompt_id": "p8", "p_value": 1e-9, "wrong_sampler_p_value": 0.0},  # correct sampler rejected
        {**base, "prompt_id": "p7", "p_value": 0.0, "wrong_sampler_p_value": 0.0, "impossible": 2},
        {**base, "prompt_id": "p6", "p_value": 0.5, "wrong_sampler_p_value": 0.3, "has_power": False,
         "power": 0.4, "n_needed": 250_000},
    ])
    table = judge_distribution_checks(checks, ALPHA)
    assert list(table.columns[:9]) == ["draft", "domain", "prompt_id", "k", "n_samples", "chi2", "dof", "p_value",
                                       "wrong_sampler_p_value"]
    assert list(table["outcome"]) == ["FAIL wrong sampler not rejected", "FAIL correct sampler rejected",
                                      "FAIL impossible sample", "no power"]
    assert list(table["passed"]) == [False, False, False, True]
    messages = failure_messages(table)
    assert len(messages) == 3
    assert "prompt p9, k=4" in messages[0] and "TV distance 0.0123" in messages[0] and "power 0.995" in messages[0]
    assert "distribution_check.seed" in messages[0]
    assert "prompt p8, k=4" in messages[1] and "exactness failure" in messages[1]
    assert "prompt p7" in messages[2] and "probability 0" in messages[2]
    # older rows (no power columns): every test counts as having power, as before
    old = judge_distribution_checks(checks.drop(columns=["has_power"]).iloc[[3]], ALPHA)
    assert list(old["outcome"]) == ["FAIL wrong sampler not rejected"]


def test_distribution_table_stage_reports_no_power_and_fails_a_family_without_power(tmp_path):
    script = load_script("workflow/scripts/distribution_table.py", "distribution_table_script")
    base = {"draft": "d", "prompt_id": "p0", "k": 1, "n_samples": 1000, "chi2": 1.0, "dof": 8, "p_value": 0.5,
            "impossible": 0, "wrong_sampler": "residual drawn from p", "power": 0.3, "target_power": 0.99}
    files = []
    for domain, has_power, wrong_p, tv, needed in [("code", True, 1e-9, 0.1, 400), ("prose", False, 0.4, 0.0, None)]:
        files.append(tmp_path / f"{domain}.parquet")
        pd.DataFrame([{**base, "domain": domain, "has_power": has_power, "wrong_sampler_p_value": wrong_p,
                       "tv_distance": tv, "n_needed": needed}]).to_parquet(files[-1])

    def run(inputs, settings):
        fake = SimpleNamespace(input=[str(f) for f in inputs], output=[str(tmp_path / "distribution.csv")],
                               log=[str(tmp_path / "table.log")], params=SimpleNamespace(settings=settings))
        script.main(fake)

    with pytest.raises(script.DistributionCheckError, match="d/prose has no test with power"):
        run(files, {"alpha": 0.01, "max_samples": 1000})
    assert not (tmp_path / "distribution.csv").exists()
    run(files, {"alpha": 0.01, "max_samples": 1000, "min_powered_share": 0.5})
    table = pd.read_csv(tmp_path / "distribution.csv")
    assert list(table["outcome"]) == ["pass", "no power"] and table["passed"].all()
    assert "no power on this prompt: d/prose p0 k=1" in (tmp_path / "table.log").read_text()


def test_settings_from_config_keep_the_old_fixed_n():
    old = DistributionSettings.from_config({"samples": 1000, "k": [3], "drafts": ["x"], "alpha": 0.01})
    assert old.samples == 1000 and old.k == (3,)
    assert old.family_size(n_jobs=4) == 4 * old.prompts_per_domain
    with pytest.raises(ValueError, match="distribution_check.min_samples"):
        DistributionSettings.from_config({"min_samples": 10, "max_samples": 5})
    # a fixed N: the test runs at N whatever its power, and says whether it has power there
    exact = {"a": 0.5, "b": 0.5}
    plan = plan_test(exact, {"w": {"a": 0.6, "b": 0.4}}, 0.01, samples=200)
    assert plan.n_samples == 200 and not plan.has_power and plan.n_needed > 200
    assert plan_test(exact, {"w": {"a": 0.6, "b": 0.4}}, 0.01, samples=5000).has_power


def test_the_stronger_wrong_sampler_is_used_where_the_first_has_no_power():
    exact = {"a": 0.5, "b": 0.3, "c": 0.2}
    subtle, strong = {"a": 0.49, "b": 0.31, "c": 0.2}, {"a": 0.3, "b": 0.3, "c": 0.2, "z": 0.2}
    laws = {STUDY_WRONG_SAMPLERS[0].name: subtle, STUDY_WRONG_SAMPLERS[1].name: strong}
    plan = plan_test(exact, laws, 0.001, max_samples=5_000, min_samples=100)
    assert plan.sampler == STUDY_WRONG_SAMPLERS[1].name and plan.has_power and plan.n_samples == 100
    assert plan.n_needed_by_sampler[STUDY_WRONG_SAMPLERS[0].name] > 5_000
    assert plan.tv_by_sampler == {STUDY_WRONG_SAMPLERS[0].name: pytest.approx(0.01),
                                  STUDY_WRONG_SAMPLERS[1].name: pytest.approx(0.2)}
    # with a cap that reaches the subtle one, it is preferred
    assert plan_test(exact, laws, 0.001, max_samples=10 ** 6).sampler == STUDY_WRONG_SAMPLERS[0].name


def test_the_verdicts_default_wrong_sampler_is_the_checks_first():
    from specdec.study.verify.distribution_verdict import FIRST_WRONG_SAMPLER

    assert FIRST_WRONG_SAMPLER == STUDY_WRONG_SAMPLERS[0].name
