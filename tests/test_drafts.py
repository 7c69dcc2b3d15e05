"""More draft proposers: prompt lookup, early exit (the target's own first layers), adaptive ModelDraft.

Greedy identity for every proposer; prompt-lookup unit cases and the zero-token path of the loop; early exit shares
the target's weights and computes the target's first n layers + norm + head; adaptive drafting stops where it should.

Distribution: the correct-sampler chi-square tests in this file form one family of DIST_FAMILY_SIZE = 2 hypotheses
(prompt lookup end to end; adaptive ModelDraft end to end), each judged at ALPHA / 2 = 0.005 (family-wise error 1%).
A wrong sampler (every draft token accepted) run through the same loop must be rejected at that threshold, with a
tenth of the samples.
"""


import pytest
import torch

import specdec.decode as decode
from specdec.decode import generate_baseline, generate_speculative
from specdec.drafts import (
    EarlyExitDraft,
    HybridDraft,
    ModelDraft,
    PromptLookupDraft,
    Proposal,
    as_proposer,
    early_exit_model,
)
from specdec.lm import CachedLM, PrefixMemoLM
from specdec.sampling import SamplingConfig, warp_logits
from specdec.study.stats import chi_square_gof
from specdec.testing import perturbed_copy, tiny_qwen2

VOCAB = 64
LAYERS = 3
KS = [1, 3, 5]
MAX_NEW = 16


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(vocab_size=VOCAB, num_layers=LAYERS, seed=0)


@pytest.fixture(scope="module")
def prompts(target):
    """4 random prompts and 4 repetitive ones (a repeated 4-gram; P + greedy continuation + P), where prompt lookup
    finds matches."""
    g = torch.Generator().manual_seed(1)
    plain = [torch.randint(0, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (4,), generator=g)]
    repetitive = []
    for i in range(2):
        p = torch.randint(0, VOCAB, (6,), generator=g).tolist()
        repetitive.append(p[:4] * 4)
        repetitive.append(p + generate_baseline(target, torch.tensor([p]), 12).tokens + p)
    return {"plain": [torch.tensor([p]) for p in plain], "repetitive": [torch.tensor([p]) for p in repetitive]}


def _proposers(target, eos_ids):
    return {
        "prompt lookup": PromptLookupDraft(VOCAB, eos_token_ids=eos_ids),
        "early exit 1": EarlyExitDraft(target, 1, eos_token_ids=eos_ids),
        "early exit 2": EarlyExitDraft(target, 2, eos_token_ids=eos_ids),
        "adaptive model 0.8": ModelDraft(perturbed_copy(target, noise=0.05), eos_token_ids=eos_ids,
                                         min_confidence=0.8),
        # lookup's blocks (2-gram matches or longer) to k, the model's to 1 token, its prompt pass with the target's
        "hybrid model_k 1": HybridDraft(PromptLookupDraft(VOCAB, ngram_max=3, ngram_min=2, eos_token_ids=eos_ids),
                                        ModelDraft(perturbed_copy(target, noise=0.05), eos_token_ids=eos_ids,
                                                   min_confidence=0.5), model_k=1, defer_prefill=False),
    }


def _check_records(result, k):
    assert result.steps[0].kind == "prefill"
    assert sum(s.emitted for s in result.steps) == len(result.tokens)
    for s in result.steps[1:]:
        assert s.drafted <= k and s.positions == s.drafted + 1
        assert s.kind == ("block" if s.drafted else "target")
        assert s.accepted <= s.drafted and 1 <= s.emitted <= s.accepted + 1


@pytest.mark.parametrize("with_eos", [False, True], ids=["no-eos", "eos"])
def test_greedy_identity_for_every_new_proposer(target, prompts, with_eos):
    all_prompts = prompts["plain"] + prompts["repetitive"]
    eos = None
    if with_eos:  # a token the target emits mid-sequence, so that EOS falls inside drafted blocks
        counts = torch.zeros(VOCAB)
        for prompt in all_prompts:
            for token in generate_baseline(target, prompt, MAX_NEW).tokens[2:-2]:
                counts[token] += 1
        eos = int(counts.argmax())
    target.generation_config.eos_token_id = eos
    try:
        proposers = _proposers(target, [eos] if eos is not None else [])
        divergences, stats = [], {}
        ended_by_eos = 0
        for index, prompt in enumerate(all_prompts):
            kind = "plain" if index < len(prompts["plain"]) else "repetitive"
            baseline = generate_baseline(target, prompt, MAX_NEW)
            ended_by_eos += eos is not None and baseline.tokens[-1] == eos
            for name, proposer in proposers.items():
                for k in KS:
                    result = generate_speculative(target, proposer, prompt, k, MAX_NEW)
                    if result.tokens != baseline.tokens:
                        divergences.append((name, k, index, baseline.tokens, result.tokens))
                    _check_records(result, k)
                    entry = stats.setdefault((name, kind), [0, 0, 0])
                    entry[0] += result.accepted
                    entry[1] += result.drafted
                    entry[2] += sum(s.kind == "target" for s in result.steps)
        assert divergences == [], f"{len(divergences)} divergent sequences, first: {divergences[0]}"
        print(f"eos={eos}: (accepted, drafted, zero-draft target steps): {stats}; baselines ended by EOS: "
              f"{ended_by_eos}")
        for kind in ("plain", "repetitive"):
            assert stats[("prompt lookup", kind)][2] > 0  # lookups that found nothing ran plain target steps
        assert stats[("prompt lookup", "repetitive")][0] > 0  # and matches were accepted
        for name in proposers:
            assert sum(stats[(name, kind)][0] for kind in ("plain", "repetitive")) > 0, name
        if eos is not None:
            assert ended_by_eos >= 2
    finally:
        target.generation_config.eos_token_id = None


# --- hybrid: the model's prompt pass waits for the first block lookup cannot draft ----------------------------------
def test_hybrid_defers_the_model_prompt_pass_until_lookup_finds_nothing(target):
    draft_model = perturbed_copy(target, noise=0.05)
    hybrid = HybridDraft(PromptLookupDraft(VOCAB, ngram_max=2), ModelDraft(draft_model))
    eager = ModelDraft(draft_model)
    prompt = [7, 3, 9, 7, 3, 11, 12]
    hybrid.prefill(prompt)
    eager.prefill(prompt)
    assert hybrid.model.session.length == 0 and eager.session.length == len(prompt)
    generator = torch.Generator().manual_seed(0)
    matched = hybrid.propose(prompt + [9, 7, 3], 3, GREEDY, generator)  # "7 3" repeats: lookup drafts
    assert matched.tokens == [11, 12, 9] and hybrid.model.session.length == 0 and matched.catchup_tokens == 0
    hybrid.rollback(len(prompt) + 2)
    context = prompt + [9, 7, 3, 11, 12, 40]  # "12 40" and "40" occur nowhere earlier: the model drafts
    late = hybrid.propose(context, 3, GREEDY, generator)
    assert late.catchup_tokens == len(context) and late.catchup_seconds > 0  # prompt and generated, in one call
    assert hybrid.model.session.length == len(context) + 2  # the last drafted token is not fed
    assert late.tokens == eager.propose(context, 3, GREEDY, generator).tokens  # the same argmaxes as eagerly
    assert eager.session.length == len(context) + 2


def test_hybrid_model_k_caps_the_models_blocks_and_not_lookups(target):
    draft_model = perturbed_copy(target, noise=0.05)
    prompt = [7, 3, 9, 7, 3, 11, 12, 13, 14]
    generator = torch.Generator().manual_seed(0)
    for model_k, defer in ((None, True), (2, False)):
        hybrid = HybridDraft(PromptLookupDraft(VOCAB, ngram_max=2), ModelDraft(draft_model), model_k=model_k,
                             defer_prefill=defer)
        hybrid.prefill(prompt)
        assert hybrid.model.session.length == (0 if defer else len(prompt))  # eager: the prompt pass ran here
        matched = hybrid.propose(prompt + [9, 7, 3], 5, GREEDY, generator)  # "7 3" repeats: lookup drafts
        assert matched.tokens == [11, 12, 13, 14, 9]  # to the loop's k, whatever model_k
        hybrid.rollback(len(prompt) + 2)
        context = prompt + [9, 7, 3, 40]  # "40" occurs nowhere earlier: the model drafts
        assert len(hybrid.propose(context, 5, GREEDY, generator).tokens) == (model_k or 5)
        assert hybrid.model_budget(1) == 1
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="model_k"):
            HybridDraft(PromptLookupDraft(VOCAB), ModelDraft(draft_model), model_k=bad)


# --- prompt lookup --------------------------------------------------------------------------------------------------
GREEDY, SAMPLED = SamplingConfig(), SamplingConfig(1.0)


@pytest.mark.parametrize(
    "context, k, expected",
    [
        ([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3], 5, [5, 6, 1, 2, 3]),  # latest of two 3-gram matches
        ([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3], 2, [5, 6]),
        ([7, 8, 9, 1, 2, 7, 3, 4, 2, 7], 4, [3, 4, 2, 7]),  # no 3-gram match: the 2-gram [2, 7]
        ([4, 5, 6, 5], 3, [6, 5]),  # only the 1-gram [5]
        ([5, 5, 5, 5], 4, [5]),  # the continuation ends where the context does
        ([1, 2, 3, 4], 3, []),  # no match
        ([3], 3, []),
    ],
)
def test_prompt_lookup_proposes_continuation_of_latest_match(context, k, expected):
    draft = PromptLookupDraft(10)
    generator = torch.Generator().manual_seed(0)
    greedy = draft.propose(context, k, GREEDY, generator)
    assert greedy.tokens == expected and greedy.q is None and greedy.draft_seconds >= 0.0
    sampled = draft.propose(context, k, SAMPLED, generator)
    assert sampled.tokens == expected
    if expected:
        assert torch.equal(sampled.q, torch.nn.functional.one_hot(torch.tensor(expected), 10).float())
    else:
        assert sampled.q is None


def test_prompt_lookup_options_and_arguments():
    context = [4, 5, 6, 5]
    generator = torch.Generator()
    assert PromptLookupDraft(10, ngram_min=2).propose(context, 3, GREEDY, generator).tokens == []
    assert PromptLookupDraft(10, eos_token_ids=[6]).propose(context, 3, GREEDY, generator).tokens == [6]
    for kwargs in ({"ngram_min": 0}, {"ngram_max": 1, "ngram_min": 2}, {"ngram_max": 2.5}):
        with pytest.raises(ValueError, match="ngram"):
            PromptLookupDraft(10, **kwargs)
    with pytest.raises(ValueError, match="vocab_size"):
        PromptLookupDraft(0)


class NoDraft:
    """Proposes nothing, ever: the loop must run plain target steps."""

    vocab_size = None

    def prefill(self, prompt):
        return 0.0

    def propose(self, context, k, sampling, generator):
        return Proposal(tokens=[], q=None, draft_seconds=1e-6)

    def rollback(self, valid_length):
        pass


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_empty_proposals_run_plain_target_steps(target, prompts, temperature):
    prompt = prompts["plain"][0]
    baseline = generate_baseline(target, prompt, MAX_NEW, temperature=temperature, top_k=20, seed=3)
    result = generate_speculative(target, NoDraft(), prompt, 4, MAX_NEW, temperature=temperature, top_k=20, seed=3)
    # Same generator draws in the same order as the baseline: the same tokens, even when sampling.
    assert result.tokens == baseline.tokens
    assert [s.kind for s in result.steps] == ["prefill"] + ["target"] * (MAX_NEW - 1)
    assert all(s.drafted == 0 and s.positions == 1 and s.emitted == 1 for s in result.steps)
    assert all(s.draft_seconds == 1e-6 for s in result.steps[1:-1])
    assert result.steps[-1].draft_seconds == 0.0  # one token left: the loop did not ask the draft
    assert result.tokens_per_pass == 1.0


# --- early exit -------------------------------------------------------------------------------------------------
def _manual_forward(target, ids, n):
    """Embeddings -> the target's first n layers (explicit causal mask) -> final norm -> LM head."""
    length = ids.shape[1]
    hidden = target.model.embed_tokens(ids)
    positions = torch.arange(length).unsqueeze(0)
    rotary = target.model.rotary_emb(hidden, positions)
    mask = torch.full((length, length), float("-inf"), dtype=hidden.dtype).triu(1)[None, None]
    for layer in target.model.layers[:n]:
        hidden = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
    return target.lm_head(target.model.norm(hidden))[0]


@torch.inference_mode()
def test_early_exit_shares_weights_and_computes_first_layers(target):
    ids = torch.tensor([[3, 9, 14, 27, 5, 40, 41, 2]])
    before = target(input_ids=ids).logits
    target_ptrs = {p.data_ptr(): name for name, p in target.named_parameters()}
    layer_size = sum(p.numel() for p in target.model.layers[0].parameters())
    for n in range(1, LAYERS + 1):
        shallow = early_exit_model(target, n)
        params = dict(shallow.named_parameters())
        assert all(p.data_ptr() in target_ptrs for p in params.values())  # no copy of any weight
        assert shallow.lm_head.weight is target.lm_head.weight
        assert shallow.model.embed_tokens.weight is target.model.embed_tokens.weight
        assert all(a is b for a, b in zip(shallow.model.layers, target.model.layers[:n]))
        assert sum(p.numel() for p in params.values()) == \
            sum(p.numel() for p in target.parameters()) - (LAYERS - n) * layer_size
        assert shallow.config.num_hidden_layers == n and len(shallow.config.layer_types) == n
        manual = _manual_forward(target, ids, n)
        assert torch.allclose(shallow(input_ids=ids).logits[0], manual, atol=1e-10)
        # through a KV-cached session, fed in pieces, as the decoding loop does
        session = CachedLM(shallow)
        pieces = torch.cat([session.extend(ids[0, :3].tolist(), 3), session.extend(ids[0, 3:4].tolist(), 1),
                            session.extend(ids[0, 4:].tolist(), 4)])
        assert torch.allclose(pieces, manual.float(), atol=1e-5)
        if n == LAYERS:
            assert torch.allclose(manual, before[0], atol=1e-10)
    assert target.config.num_hidden_layers == LAYERS  # the target is untouched
    assert torch.equal(target(input_ids=ids).logits, before)
    draft = EarlyExitDraft(CachedLM(target), 2)  # a session is accepted for its model
    assert draft.vocab_size == VOCAB and draft.n_layers == 2
    for bad in (0, LAYERS + 1):
        with pytest.raises(ValueError, match="n_layers"):
            early_exit_model(target, bad)
    with pytest.raises(TypeError):
        EarlyExitDraft(torch.nn.Linear(2, 2), 1)


# --- adaptive drafting ---------------------------------------------------------------------------------------------
def _expected_full_blocks(result, k, max_new):
    emitted, expected = 1, []
    for s in result.steps[1:]:
        expected.append(min(k, max_new - emitted - 1))
        emitted += s.emitted
    return expected


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_adaptive_block_sizes(target, prompts, temperature):
    draft_model = perturbed_copy(target, noise=0.05)
    prompt, k = prompts["plain"][1], 4
    run = lambda confidence: generate_speculative(
        target, ModelDraft(draft_model, min_confidence=confidence), prompt, k, MAX_NEW, temperature, seed=2)
    never_confident = run(1.01)
    # one token per block (none in the last step, where the length budget leaves no room for drafting)
    assert [s.drafted for s in never_confident.steps[1:]] == _expected_full_blocks(never_confident, 1, MAX_NEW)
    assert sum(s.drafted == 1 for s in never_confident.steps) >= 5
    full = run(None)
    assert [s.drafted for s in full.steps[1:]] == _expected_full_blocks(full, k, MAX_NEW)
    always = run(0.0)
    assert always.tokens == full.tokens and [s.drafted for s in always.steps] == [s.drafted for s in full.steps]
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="min_confidence"):
            ModelDraft(draft_model, min_confidence=bad)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(1.0, top_k=8)], ids=["greedy", "top-k 8"])
def test_adaptive_stops_at_first_unconfident_token(target, sampling):
    threshold, k = 0.9, 6
    draft_model = perturbed_copy(target, noise=0.05)
    reference = PrefixMemoLM(draft_model)
    generator = torch.Generator().manual_seed(0)
    stopped_early = 0
    for start in range(12):
        context = [start, 2 * start + 1, 7]
        draft = ModelDraft(draft_model, min_confidence=threshold)
        draft.prefill(context[:-1])
        tokens = draft.propose(context, k, sampling, generator).tokens
        confidences = []
        for i, token in enumerate(tokens):
            logits = reference.next_token_logits(tuple(context + tokens[:i]))
            probs = torch.softmax(logits, -1) if sampling.greedy else warp_logits(logits, sampling)
            confidences.append(float(probs[token]))
        assert all(c >= threshold for c in confidences[:-1]), confidences
        assert len(tokens) == k or confidences[-1] < threshold
        stopped_early += len(tokens) < k
    assert stopped_early > 0


class _OnTheLastTokens:
    """A draft given only what follows the context's first `skip` tokens (its prompt, contexts and lengths shifted):
    what a prompt window of len(prompt) - skip tokens should draft like."""

    def __init__(self, draft, skip):
        self.draft, self.skip, self.vocab_size = draft, skip, draft.vocab_size

    def prefill(self, prompt):
        return self.draft.prefill(prompt[self.skip:])

    def propose(self, context, k, sampling, generator):
        return self.draft.propose(context[self.skip:], k, sampling, generator)

    def rollback(self, valid_length):
        self.draft.rollback(valid_length - self.skip)


@pytest.mark.parametrize("window", [1, 5, 12, 40])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_prompt_window_drafts_as_the_draft_on_the_prompts_last_tokens(target, window, temperature):
    """The windowed draft proposes what the same draft proposes given only the prompt's last `window` tokens, block
    after block (its cache cropped after each rejection as the loop asks); a window as long as the prompt or longer
    changes nothing; at temperature 0 the output is plain greedy decoding's whatever the window."""
    draft_model = perturbed_copy(target, noise=0.05)
    prompt = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    run = lambda draft: generate_speculative(target, draft, prompt, 3, MAX_NEW, temperature, seed=3)
    windowed = run(ModelDraft(draft_model, prompt_window=window))
    skip = max(0, prompt.shape[1] - window)
    reference = run(_OnTheLastTokens(ModelDraft(draft_model), skip) if skip else ModelDraft(draft_model))
    assert windowed.tokens == reference.tokens
    assert [(s.drafted, s.accepted) for s in windowed.steps] == [(s.drafted, s.accepted) for s in reference.steps]
    assert sum(s.accepted < s.drafted for s in windowed.steps) > 0  # rejections: the rollback ran
    if temperature == 0.0:
        assert windowed.tokens == generate_baseline(target, prompt, MAX_NEW).tokens


def test_a_prompt_window_prefills_only_the_window_and_catches_up_lazily(target):
    draft_model = perturbed_copy(target, noise=0.05)
    prompt = list(range(3, 15))
    draft = ModelDraft(draft_model, prompt_window=4)
    draft.prefill(prompt)
    assert (draft.skipped, draft.session.length) == (8, 4)
    draft.prefill(prompt, lazy=True)  # a deferred prompt pass (the hybrid's): nothing read yet
    assert (draft.skipped, draft.session.length) == (8, 0)
    proposal = draft.propose(prompt + [7], 2, GREEDY, torch.Generator())
    assert proposal.catchup_tokens == 5 and draft.session.length == 4 + 1 + 1  # the window, 7, the first proposal
    eager = ModelDraft(draft_model, prompt_window=4)
    eager.prefill(prompt)
    assert eager.propose(prompt + [7], 2, GREEDY, torch.Generator()).tokens == proposal.tokens
    draft.rollback(len(prompt) + 1)  # the block rejected: the window and the loop's token stay
    assert draft.session.length == 5


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_a_prompt_window_that_is_not_a_positive_integer_is_refused(target, bad):
    with pytest.raises(ValueError, match="prompt_window must be a positive integer"):
        ModelDraft(target, prompt_window=bad)


def test_as_proposer_for_models_sessions_and_proposers(target):
    assert isinstance(as_proposer(target), ModelDraft)
    session = CachedLM(target)
    assert as_proposer(session).session is session
    for proposer in (PromptLookupDraft(VOCAB), EarlyExitDraft(target, 1), ModelDraft(target, min_confidence=0.5)):
        assert as_proposer(proposer) is proposer


# --- distribution, end to end through generate_speculative ---------------------------------------------------------
ALPHA = 0.01
DIST_FAMILY_SIZE = 2
THRESHOLD = ALPHA / DIST_FAMILY_SIZE
SAMPLES = 20_000
E2E_VOCAB = 8
E2E_LENGTH = 4  # the first block may draft 2 tokens (the prefill emits one, the verify pass one)
E2E_K = 3
E2E_SAMPLING = SamplingConfig(1.0, top_k=4)
# Repetitive, so that prompt lookup finds matches (suffix [1, 5] -> propose [2, 1]) and sometimes none.
E2E_PROMPT = [1, 5, 2, 1, 5]


def _memo_model(seed):
    return PrefixMemoLM(tiny_qwen2(vocab_size=E2E_VOCAB, hidden_size=16, seed=seed, init_std=0.3), eos_token_ids=())


def _exact_continuations(target: PrefixMemoLM, prompt, config, length):
    """P(sequence) for every length-`length` continuation of positive probability (float64, rows renormalised)."""
    exact = {}

    def walk(seq, prob):
        if len(seq) == length:
            exact[seq] = prob
            return
        probs = warp_logits(target.next_token_logits(tuple(prompt) + seq), config).double()
        probs = probs / probs.sum()
        for token in probs.nonzero()[:, 0].tolist():
            walk(seq + (token,), prob * float(probs[token]))

    walk((), 1.0)
    return exact


def _end_to_end(draft_factory, samples=SAMPLES):
    target = _memo_model(3)
    exact = _exact_continuations(target, E2E_PROMPT, E2E_SAMPLING, E2E_LENGTH)
    prompt = torch.tensor([E2E_PROMPT])
    sequences, blocks = [], []
    draft = draft_factory()
    for seed in range(samples):
        result = generate_speculative(target, draft, prompt, E2E_K, E2E_LENGTH, E2E_SAMPLING.temperature,
                                      E2E_SAMPLING.top_k, seed=seed)
        sequences.append(tuple(result.tokens))
        blocks += [(s.drafted, s.accepted) for s in result.steps[1:]]
    return chi_square_gof(sequences, exact), blocks


def _report(name, fit, blocks):
    drafted = sum(d for d, _ in blocks)
    print(f"{name}: chi2={fit.chi2:.2f} dof={fit.dof} p={fit.p_value:.4g}; block sizes "
          f"{ {n: sum(d == n for d, _ in blocks) for n in range(E2E_K + 1)} }, acceptance "
          f"{sum(a for _, a in blocks) / max(drafted, 1):.3f}")


@pytest.mark.slow  # the fast tier has prompt lookup's chi-square test with a wrong rule in tests/test_registry.py
@pytest.mark.extended  # the same law again at more samples: in the extended runs
def test_prompt_lookup_distribution_matches_target():
    fit, blocks = _end_to_end(lambda: PromptLookupDraft(E2E_VOCAB))
    _report("prompt lookup", fit, blocks)
    assert fit.n_samples == SAMPLES and fit.impossible == 0
    assert fit.p_value > THRESHOLD
    # both paths ran: matches (some accepted, some rejected) and empty lookups (plain target steps)
    assert any(d == 0 for d, _ in blocks) and any(0 < a for _, a in blocks) and any(a < d for d, a in blocks)


@pytest.mark.slow  # the adaptive stop's exact law is checked in the fast tier (tests/test_distribution.py, hybrid-adaptive)
@pytest.mark.extended  # and the tiny study's distribution check samples the adaptive draft: this one in the extended runs
def test_adaptive_model_draft_distribution_matches_target():
    fit, blocks = _end_to_end(lambda: ModelDraft(_memo_model(4), min_confidence=0.3))
    _report("adaptive ModelDraft", fit, blocks)
    assert fit.n_samples == SAMPLES and fit.impossible == 0
    assert fit.p_value > THRESHOLD
    # the adaptive stop really ran: first blocks (budget 2) of both sizes
    assert {d for d, _ in blocks} >= {1, 2}


def test_prompt_lookup_end_to_end_rejects_wrong_sampler(monkeypatch):
    """The same test with every draft token accepted must fail, already at a tenth of the sample size."""
    def accept_all(p, q, draft_tokens, generator):
        k = draft_tokens.shape[0]
        return k, int(torch.multinomial(p[k].double(), 1, generator=generator))

    monkeypatch.setattr(decode, "_speculative_step_unchecked", accept_all)
    fit, blocks = _end_to_end(lambda: PromptLookupDraft(E2E_VOCAB), samples=SAMPLES // 10)
    _report("prompt lookup, every draft token accepted", fit, blocks)
    assert fit.p_value < THRESHOLD


class FirstIds:
    """A session whose logits are -inf past the first `vocab` ids: what LeanLM.limit_head_vocab gives (its test in
    tests/test_lean.py shows the logits are exactly those), on the tiny Hugging Face models of these tests."""

    def __init__(self, session, vocab):
        self.session, self.vocab = session, vocab

    def extend(self, tokens, n_logits):
        logits = self.session.extend(tokens, n_logits).clone()
        logits[..., self.vocab:] = float("-inf")
        return logits

    def __getattr__(self, name):
        return getattr(self.session, name)


@pytest.mark.slow
def test_a_draft_over_the_first_ids_keeps_the_targets_distribution():
    """q zero on the ids past the first 3 of 8 (top-k 4 keeps mass there for the target): the rule still emits the
    target's law, through rejections and the residual (the chi-square test's power: the wrong-sampler test above)."""
    fit, blocks = _end_to_end(lambda: ModelDraft(FirstIds(PrefixMemoLM(
        tiny_qwen2(vocab_size=E2E_VOCAB, hidden_size=16, seed=4, init_std=0.3), eos_token_ids=()), 3)))
    _report("ModelDraft over the first 3 ids", fit, blocks)
    assert fit.n_samples == SAMPLES and fit.impossible == 0
    assert fit.p_value > THRESHOLD
    assert any(a < d for d, a in blocks) and any(a > 0 for _, a in blocks)


@pytest.mark.slow
def test_the_first_ids_test_rejects_a_rule_that_never_leaves_the_drafts_ids(monkeypatch):
    """Its power where it matters: a rule whose next token never lies past the draft's first 3 ids (the residual's
    mass there dropped) fails it already at a tenth of the sample size."""
    original = decode._speculative_step_unchecked

    def within_draft_ids(p, q, draft_tokens, generator):
        kept, token = original(p, q, draft_tokens, generator)
        return kept, token if token < 3 else int(torch.argmax(p[kept][:3]))

    monkeypatch.setattr(decode, "_speculative_step_unchecked", within_draft_ids)
    fit, blocks = _end_to_end(lambda: ModelDraft(FirstIds(PrefixMemoLM(
        tiny_qwen2(vocab_size=E2E_VOCAB, hidden_size=16, seed=4, init_std=0.3), eos_token_ids=()), 3)),
        samples=SAMPLES // 10)
    assert fit.p_value < THRESHOLD
