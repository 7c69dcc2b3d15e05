"""The decoding loops: greedy identity, EOS inside a block, exact lengths, determinism, KV rollback, bad input."""

import copy

import pytest
import torch

from specdec.decode import (
    VocabularyMismatchError,
    generate_baseline,
    generate_speculative,
)
from specdec.drafts import HybridDraft, ModelDraft, PromptLookupDraft
from specdec.fp32.kernels import available_bf16_backends, use_row_adaptive_bf16_linear
from specdec.lm import CachedLM
from specdec.testing import perturbed_copy, tiny_qwen2

VOCAB = 64
N_PROMPTS = 10
KS = [1, 2, 3, 5, 8]  # k = 1, small, odd, large: the fast tier's budget (README) allows five
MAX_NEW = 16
BF16_BACKEND = "avx2-bf16" if "avx2-bf16" in available_bf16_backends() else "bf16"


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 12, (N_PROMPTS,), generator=g)
    return [torch.randint(0, VOCAB, (1, int(n)), generator=g) for n in lengths]


@pytest.fixture(scope="module")
def eos_token(target, prompts):
    """A token the target emits mid-sequence for some prompts, so that EOS falls inside drafted blocks."""
    counts = torch.zeros(VOCAB)
    for prompt in prompts:
        for token in generate_baseline(target, prompt, MAX_NEW).tokens[2:-2]:
            counts[token] += 1
    return int(counts.argmax())


def _drafts(target):
    return {
        "unrelated": tiny_qwen2(vocab_size=VOCAB, seed=7),
        "mostly agrees": perturbed_copy(target, noise=0.01),
        "target itself": target,
        # The draft's precision is free: the rule uses the q it computed, so a bf16 copy keeps the identity (run as
        # the study runs a bf16 draft: prompt passes of more than 8 rows on an fp32 copy of its weights, few rows on
        # the AVX2 kernel reading the bf16 weights where this machine has it).
        "target in bfloat16": use_row_adaptive_bf16_linear(copy.deepcopy(target).to(torch.bfloat16),
                                                           default=BF16_BACKEND),
    }


@pytest.mark.parametrize("with_eos", [False, True], ids=["no-eos", "eos"])
def test_greedy_speculative_equals_greedy_baseline(target, prompts, eos_token, with_eos):
    eos = eos_token if with_eos else None
    drafts = _drafts(target)
    for model in [target, *drafts.values()]:
        model.generation_config.eos_token_id = eos
    try:
        divergences, acceptance, eos_in_block, ended_by_eos = [], {}, 0, 0
        for prompt_index, prompt in enumerate(prompts):
            baseline = generate_baseline(target, prompt, MAX_NEW)
            if eos is None:
                assert len(baseline.tokens) == MAX_NEW
            else:
                assert len(baseline.tokens) == MAX_NEW or baseline.tokens[-1] == eos
                ended_by_eos += baseline.tokens[-1] == eos
            for name, draft in drafts.items():
                for k in KS:
                    result = generate_speculative(target, draft, prompt, k, MAX_NEW)
                    if result.tokens != baseline.tokens:
                        divergences.append((name, k, prompt_index, baseline.tokens, result.tokens))
                    assert sum(s.emitted for s in result.steps) == len(result.tokens)
                    acceptance.setdefault(name, []).append((result.accepted, result.drafted))
                    last = result.steps[-1]
                    eos_in_block += eos is not None and last.kind == "block" and last.accepted > 0 and \
                        result.tokens[-1] == eos and last.emitted <= last.accepted
        assert divergences == [], f"{len(divergences)} divergent sequences, first: {divergences[0]}"
        mean = {name: sum(a for a, _ in pairs) / sum(d for _, d in pairs) for name, pairs in acceptance.items()}
        print(f"eos={eos} mean acceptance by draft: {mean}; runs with EOS accepted from a draft block: "
              f"{eos_in_block}; baselines ended by EOS: {ended_by_eos}")
        # The three drafts really are the intended kinds, so the identity is tested across acceptance regimes.
        assert mean["unrelated"] < 0.2 < mean["mostly agrees"] < 0.95 <= mean["target itself"]
        assert mean["target in bfloat16"] > 0.5
        if eos is not None:
            assert ended_by_eos >= 3 and eos_in_block >= 3
    finally:
        for model in [target, *drafts.values()]:
            model.generation_config.eos_token_id = None


def test_max_new_tokens_is_exact_and_budget_limits_drafting(target, prompts):
    for max_new in [1, 2, 5, 9]:
        result = generate_speculative(target, target, prompts[0], 8, max_new)
        assert len(result.tokens) == max_new
        assert all(s.drafted <= max_new - 1 for s in result.steps)


def test_same_seed_same_tokens_and_accept_counts(target, prompts):
    draft = perturbed_copy(target, noise=0.05)
    runs = [generate_speculative(target, draft, prompts[3], 4, 20, temperature=0.8, top_p=0.95, seed=5)
            for _ in range(3)]
    assert len({tuple(r.tokens) for r in runs}) == 1
    assert len({tuple(s.accepted for s in r.steps) for r in runs}) == 1
    other = generate_speculative(target, draft, prompts[3], 4, 20, temperature=0.8, top_p=0.95, seed=6)
    assert other.tokens != runs[0].tokens  # the seed is really used
    baseline_runs = [generate_baseline(target, prompts[3], 20, temperature=0.8, seed=5).tokens for _ in range(2)]
    assert baseline_runs[0] == baseline_runs[1]


def _cache_tensors(session: CachedLM):
    layers = session._cache.layers
    return [(layer.keys.clone(), layer.values.clone()) for layer in layers]


def test_kv_rollback_equals_fresh_forward(target):
    session = CachedLM(target)
    prefix, rejected = [3, 9, 14, 27, 5], [40, 41, 42]
    session.extend(prefix + rejected, 4)
    session.crop(len(prefix))
    assert session.length == len(prefix)
    fresh = CachedLM(target)
    fresh.extend(prefix, 1)
    for (k1, v1), (k2, v2) in zip(_cache_tensors(session), _cache_tensors(fresh)):
        assert torch.allclose(k1, k2, atol=1e-10) and torch.allclose(v1, v2, atol=1e-10)
    # and the rolled-back cache continues exactly like the fresh one
    assert torch.allclose(session.extend([7], 1), fresh.extend([7], 1), atol=1e-10)


def test_caches_after_speculative_run_equal_fresh_forward(target, prompts):
    target_session, draft_session = CachedLM(target), CachedLM(perturbed_copy(target, noise=0.05))
    result = generate_speculative(target_session, ModelDraft(draft_session), prompts[1], 4, 16)
    assert any(s.accepted < s.drafted for s in result.steps), "the run should include rejections"
    sequence = prompts[1][0].tolist() + result.tokens
    for session in (target_session, draft_session):
        assert session.length <= len(sequence) - 1
        fresh = CachedLM(session.model)
        fresh.extend(sequence[: session.length], 1)
        for (k1, v1), (k2, v2) in zip(_cache_tensors(session), _cache_tensors(fresh)):
            assert torch.allclose(k1, k2, atol=1e-9) and torch.allclose(v1, v2, atol=1e-9)


def test_catchup_after_fully_accepted_block_is_recorded(target, prompts):
    result = generate_speculative(target, target, prompts[2], 3, 20)
    blocks = [s for s in result.steps if s.kind == "block"]
    assert all(s.accepted == s.drafted for s in blocks)
    # every block after a fully accepted one starts with a two-token catch-up call
    assert all(s.catchup_tokens == 2 and s.catchup_seconds > 0 for s in blocks[1:])
    assert blocks[0].catchup_tokens == 0
    assert result.tokens_per_pass > 3


def test_vocabulary_mismatch_is_refused_before_decoding(target, prompts):
    small = tiny_qwen2(vocab_size=VOCAB // 2, seed=1)
    draft = ModelDraft(small)
    with pytest.raises(VocabularyMismatchError, match="vocabulary"):
        generate_speculative(target, draft, prompts[0], 4, 8)
    assert draft.session.length == 0  # nothing was decoded


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 0}, "k must be"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": 1.0, "top_p": 1.2}, "top_p"),
        ({"input_ids": torch.tensor([1, 2, 3])}, "shape"),
    ],
)
def test_bad_arguments_raise_value_error(target, prompts, kwargs, message):
    args = {"input_ids": prompts[0], "k": 2, "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate_speculative(target, target, **args)


def test_steps_record_the_draft_models_kernel(target, prompts):
    bf16_draft = use_row_adaptive_bf16_linear(copy.deepcopy(target).to(torch.bfloat16), default=BF16_BACKEND)
    result = generate_speculative(target, ModelDraft(bf16_draft), prompts[0], 3, 6)
    assert {s.draft_kernel for s in result.steps if s.kind == "block"} == {BF16_BACKEND}
    result = generate_speculative(target, ModelDraft(target), prompts[0], 3, 6)
    assert {s.draft_kernel for s in result.steps if s.kind == "block"} == {"linear"}  # torch's own nn.Linear
    hybrid = HybridDraft(PromptLookupDraft(VOCAB), ModelDraft(bf16_draft))
    result = generate_speculative(target, hybrid, prompts[0], 3, 6)
    assert {s.draft_kernel for s in result.steps if s.kind == "block"} == {BF16_BACKEND}  # its model's kernel
