"""Every registered draft kind gets the same checks, so a new kind gets them for free:
- built from its declared fields (required ones filled from their JSON schema), it keeps greedy identity;
- above temperature 0, each proposal's q is the law its tokens were drawn from after warping (support within the
  warped top-k, and a chi-square of the drawn tokens against q, row by row);
- the speculative output follows the target's exact distribution (chi-square), and a wrong rule run through the
  same loop with the same proposer is rejected at a tenth of the samples.

Multiple testing: the correct-sampler chi-square tests of this file form one family per check (the q-law family and
the end-to-end family), each test judged at ALPHA / (number of kinds) (Bonferroni, family-wise error 1%); the
mutants and wrong samplers must fall below the same threshold.

A toy kind, "propose the last token again", is defined in tests/toy_draft.py (imported here, so it gets every
check); the tiny study of tests/test_workflow.py runs it through the config's `plugins` and the whole DAG
(test_a_plugin_kind_runs_through_the_whole_dag).
"""

from __future__ import annotations

import importlib
import numpy as np
import pytest
import torch
from scipy import stats

import specdec.decode as decode
from specdec.decode import generate_baseline, generate_speculative
from specdec.drafts import DraftResources, ModelDraft, Proposal, get_kind, kind_names
from specdec.lm import CachedLM, PrefixMemoLM
from specdec.sampling import SamplingConfig
from specdec.study.verify.distribution import exact_first_tokens
from specdec.study.stats import chi_square_gof
from specdec.testing import example_spec, perturbed_copy, tiny_qwen2
from toy_draft import RepeatLastDraft  # noqa: F401  (registers the toy kind: every check below runs on it)


# --- building any kind from its declared fields --------------------------------------------------------------------
def build(kind_name: str, target, draft_model) -> object:
    """The kind's proposer over `draft_model` (a kind whose model is not a Hugging Face model, e.g. a feature
    head: a fresh untrained one of its own, made for the target)."""
    kind, spec = get_kind(kind_name), example_spec(get_kind(kind_name))
    if kind.untrained is not None:
        draft_model = kind.untrained(spec, target)
    resources = DraftResources(target=target, vocab_size=target.config.vocab_size, eos_token_ids=frozenset(),
                               draft_model=(lambda: draft_model) if kind.model else None)
    return kind.build(spec, resources)


def memoised(proposer):
    """The proposer with every KV-cached model session inside it (its own, or a component's) answered from a
    prefix memo instead: the same logits per prefix, computed once, so thousands of draws stay cheap."""
    for owner in [proposer, *vars(proposer).values()]:
        if isinstance(getattr(owner, "session", None), CachedLM):
            owner.session = PrefixMemoLM(owner.session.model, owner.session.eos_token_ids)
    return proposer


KINDS = kind_names()
ALPHA = 0.01
THRESHOLD = ALPHA / len(KINDS)


def test_every_builtin_kind_and_the_toy_are_registered():
    assert {"model", "truncated", "distilled", "early_exit", "prompt_lookup", "hybrid", "feature_head",
            "repeat_last"} <= set(KINDS)


# --- greedy identity ------------------------------------------------------------------------------------------------
VOCAB, MAX_NEW = 64, 12


@pytest.fixture(scope="module")
def greedy_pair():
    target = tiny_qwen2(vocab_size=VOCAB, num_layers=3, seed=0)
    return target, perturbed_copy(target, noise=0.05)


def assert_greedy_identity(target, new_draft, kind_name, lowest_token=0):
    """Random and repetitive prompts (lookup-style kinds find matches), k 1 and 3: every speculative sequence equals
    greedy decoding, and the kind did propose."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(lowest_token, VOCAB, (int(n),), generator=g).tolist() for n in (3, 7, 11)]
    prompts += [p[:3] * 3 for p in prompts]
    drafted = 0
    for prompt in prompts:
        ids = torch.tensor([prompt])
        baseline = generate_baseline(target, ids, MAX_NEW).tokens
        for k in (1, 3):
            result = generate_speculative(target, new_draft(), ids, k, MAX_NEW)
            assert result.tokens == baseline, (kind_name, k, prompt)
            drafted += result.drafted
    assert drafted > 0


def test_a_draft_can_draft_with_the_model_another_draft_of_its_kind_makes():
    kind = get_kind("feature_head")
    own, shared = {"kind": "feature_head"}, {"kind": "feature_head", "head": "h1", "lookup": True}
    assert kind.model_name("h1", own) == "h1" and kind.makes_own_model(own)
    assert kind.model_name("h2", shared) == "h1" and not kind.makes_own_model(shared)
    assert not get_kind("distilled").shared_from


@pytest.mark.parametrize("kind_name", KINDS)
def test_greedy_identity_for_every_kind(greedy_pair, kind_name):
    target, draft_model = greedy_pair
    assert_greedy_identity(target, lambda: build(kind_name, target, draft_model), kind_name)


# --- greedy identity on the quantized engine (runtime.weights gguf) --------------------------------------------------
@pytest.fixture(scope="module")
def lean_files(tmp_path_factory):
    from specdec.testing import GGUF_TARGET_SCALES, tiny_gguf_with_tokenizer

    root = tmp_path_factory.mktemp("registry-gguf")
    return (tiny_gguf_with_tokenizer(root / "target.gguf", layers=2, norm_scale=GGUF_TARGET_SCALES),
            tiny_gguf_with_tokenizer(root / "draft.gguf", layers=1, norm_scale=GGUF_TARGET_SCALES[:1]))


@pytest.mark.skipif(not importlib.import_module("specdec.gguf.quant").available(),
                    reason="the quantized product is not built")
@pytest.mark.parametrize("kind_name", KINDS)
def test_greedy_identity_for_every_kind_on_the_quantized_engine(lean_files, kind_name):
    """Each kind built as a gguf-regime decode job builds it (specdec.load.make_draft: a lean target, the draft's
    model from its GGUF file, early exits over the target's weights); a kind that cannot run there is refused by
    name before any model loads."""
    from specdec.errors import DraftSpecError
    from specdec.gguf.loading import load_gguf_for_decoding
    from specdec.load import make_draft
    from specdec.runtime import Runtime

    runtime = Runtime(weights="gguf", threads=1)
    target, vocabulary = load_gguf_for_decoding(lean_files[0], runtime, max_length=64)
    kind, spec = get_kind(kind_name), example_spec(get_kind(kind_name))
    draft_dir = lean_files[1]
    if kind.load is not None:  # weights of its own kind (a feature head): an untrained one, saved for this target
        draft_dir = lean_files[0].parent / f"{kind_name}-model"
        kind.untrained(spec, target).save(draft_dir)
    elif kind.model == "own" and not kind.gguf_cut:
        with pytest.raises(DraftSpecError, match=f"'{kind_name}'"):
            make_draft("d", spec, target, vocabulary, draft_dir, runtime)
        return
    assert_greedy_identity(target, lambda: make_draft("d", spec, target, vocabulary, draft_dir, runtime),
                           kind_name, lowest_token=3)  # the tiny files' first ids are special tokens


# --- q is the law the tokens were drawn from -----------------------------------------------------------------------
Q_SAMPLING = SamplingConfig(0.9, top_k=4)
Q_DRAWS = 1500
Q_CONTEXT = [7, 3, 9, 7, 3]  # repeats a 2-gram, so lookup-style kinds propose too


def _pooled_chi_square(groups: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """p-value of the chi-squares of several (observed counts, probabilities) groups, summed with their dof."""
    chi2, dof = 0.0, 0
    for observed, probs in groups:
        keep = probs > 0
        expected = probs[keep] * observed.sum()
        if observed[~keep].sum():
            return 0.0  # a token drawn where q is 0
        if keep.sum() < 2 or observed.sum() < 20:
            continue
        chi2 += float(((observed[keep] - expected) ** 2 / expected).sum())
        dof += int(keep.sum()) - 1
    return float(stats.chi2.sf(chi2, dof)) if dof else 1.0


def q_law_p_value(proposer, context=Q_CONTEXT, draws=Q_DRAWS, sampling=Q_SAMPLING) -> float:
    """Draw proposals of 2 tokens; check each q row's shape and support, then test row i's tokens against q[i]
    within each group of proposals that share tokens[:i] (q[i] is a function of the context and tokens[:i])."""
    rows: dict[tuple, list] = {}
    for seed in range(draws):
        proposer.prefill(context[:-1])
        proposal = proposer.propose(context, 2, sampling, torch.Generator().manual_seed(seed))
        proposer.rollback(len(context) - 1)
        assert proposal.q is not None and tuple(proposal.q.shape) == (len(proposal.tokens), VOCAB)
        assert torch.allclose(proposal.q.double().sum(-1), torch.ones(len(proposal.tokens), dtype=torch.float64),
                              atol=1e-5)
        if sampling.top_k:
            assert ((proposal.q > 0).sum(-1) <= sampling.top_k).all(), "q is not the warped (top-k) distribution"
        for i, token in enumerate(proposal.tokens):
            prefix = tuple(proposal.tokens[:i])
            entry = rows.setdefault((i, prefix), [proposal.q[i].double(), np.zeros(VOCAB)])
            assert torch.allclose(entry[0], proposal.q[i].double(), atol=1e-6), "q[i] changed for the same prefix"
            entry[1][token] += 1
    return _pooled_chi_square([(counts, q.numpy()) for q, counts in rows.values()])


@pytest.fixture(scope="module")
def q_pair():
    target = tiny_qwen2(vocab_size=VOCAB, num_layers=2, seed=1, init_std=0.3)
    return target, perturbed_copy(target, noise=0.3, seed=2)


@pytest.mark.parametrize("kind_name", KINDS)
def test_q_is_the_law_the_tokens_were_drawn_from(q_pair, kind_name):
    target, draft_model = q_pair
    p = q_law_p_value(memoised(build(kind_name, target, draft_model)))
    print(f"{kind_name}: q-law p = {p:.3g}")
    assert p > THRESHOLD


class _TokensFromElsewhere:
    """Mutants of a model draft: q right, token drawn from another law (argmax), or token right, q the unwarped
    softmax of the draft's logits. Both must fail the q-law check."""

    def __init__(self, model, mutation: str):
        self.inner, self.memo, self.mutation = ModelDraft(PrefixMemoLM(model)), PrefixMemoLM(model), mutation

    def prefill(self, prompt):
        return self.inner.prefill(prompt)

    def rollback(self, valid_length):
        self.inner.rollback(valid_length)

    def propose(self, context, k, sampling, generator):
        proposal = self.inner.propose(context, 1, sampling, generator)
        logits = self.memo.next_token_logits(tuple(context))
        if self.mutation == "argmax token":
            return Proposal(tokens=[int(logits.argmax())], q=proposal.q)
        return Proposal(tokens=proposal.tokens, q=torch.softmax(logits.double(), -1)[None])


@pytest.mark.parametrize("mutation", ["argmax token", "unwarped q"])
def test_q_law_check_rejects_a_q_that_is_not_the_law(q_pair, mutation):
    _, draft_model = q_pair
    if mutation == "unwarped q":
        with pytest.raises(AssertionError, match="warped"):
            q_law_p_value(_TokensFromElsewhere(draft_model, mutation))
        # the support check aside, the chi-square alone rejects it too (no top-k; temperature 0.5 against 1)
        p = q_law_p_value(_TokensFromElsewhere(draft_model, mutation), sampling=SamplingConfig(0.5))
    else:
        p = q_law_p_value(_TokensFromElsewhere(draft_model, mutation))
    print(f"{mutation}: q-law p = {p:.3g}")
    assert p < THRESHOLD


# --- end to end: the output follows the target's distribution -------------------------------------------------------
E2E_VOCAB, E2E_LENGTH, E2E_K, E2E_SAMPLES = 8, 4, 3, 3000
E2E_SAMPLING = SamplingConfig(1.0, top_k=4)
E2E_PROMPT = [1, 5, 2, 1, 5]


@pytest.fixture(scope="module")
def e2e():
    target_model = tiny_qwen2(vocab_size=E2E_VOCAB, hidden_size=16, seed=3, init_std=0.3)
    target = PrefixMemoLM(target_model, eos_token_ids=())
    draft_model = tiny_qwen2(vocab_size=E2E_VOCAB, hidden_size=16, seed=4, init_std=0.3)
    exact = exact_first_tokens(target, E2E_PROMPT, E2E_SAMPLING, E2E_LENGTH)
    return target_model, target, draft_model, exact


def _e2e_samples(e2e, kind_name, samples):
    target_model, target, draft_model, _ = e2e
    draft = memoised(build(kind_name, target_model, PrefixMemoLM(draft_model, eos_token_ids=())))
    prompt = torch.tensor([E2E_PROMPT])
    return [tuple(generate_speculative(target, draft, prompt, E2E_K, E2E_LENGTH, E2E_SAMPLING.temperature,
                                       E2E_SAMPLING.top_k, seed=seed).tokens) for seed in range(samples)]


@pytest.mark.parametrize("kind_name", KINDS)
def test_every_kind_follows_the_target_distribution_and_a_wrong_rule_is_rejected(e2e, kind_name, monkeypatch):
    exact = e2e[3]
    fit = chi_square_gof(_e2e_samples(e2e, kind_name, E2E_SAMPLES), exact)
    print(f"{kind_name}: chi2 {fit.chi2:.1f} / {fit.dof}, p = {fit.p_value:.3g}")
    assert fit.impossible == 0 and fit.p_value > THRESHOLD

    def accept_all(p, q, draft_tokens, generator):
        k = draft_tokens.shape[0]
        return k, int(torch.multinomial(p[k].double(), 1, generator=generator))

    monkeypatch.setattr(decode, "_speculative_step_unchecked", accept_all)
    wrong = chi_square_gof(_e2e_samples(e2e, kind_name, E2E_SAMPLES // 10), exact)
    print(f"{kind_name}, every draft token accepted: chi2 {wrong.chi2:.1f}, p = {wrong.p_value:.3g}")
    assert wrong.p_value < THRESHOLD
