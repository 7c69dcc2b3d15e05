"""bench/hybrid_policy.py's simulation of a hybrid draft's policy at temperature 0: the blocks it prices are the ones
HybridDraft would draft (lookup's to k, the model's to model_k, stopped by min_confidence), accepted as far as they
match the target's tokens."""

import runpy
from pathlib import Path

import pytest

from specdec.drafts.lookup import PromptLookupDraft

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def simulate():
    return runpy.run_path(str(BENCH / "hybrid_policy.py"))["simulate"]


def _counting():
    calls = []

    def cost(kind, n):
        calls.append((kind, n))
        return 1.0 if kind == "verify" else 0.0  # seconds = target passes

    return cost, calls


PROMPT = [50, 51, 52]
GENERATED = list(range(10))  # nothing repeats: lookup never drafts


@pytest.mark.parametrize("k, model_k, passes", [(6, None, 2), (6, 2, 3), (2, None, 3), (1, None, 5)])
def test_a_perfect_model_draft_fills_its_blocks(simulate, k, model_k, passes):
    cost, calls = _counting()
    seconds = simulate(PROMPT, GENERATED, GENERATED, [1.0] * 10, PromptLookupDraft(64), None, k, cost,
                       model_k=model_k)
    assert seconds == passes  # 9 tokens after the first, each pass emits its block + 1
    assert [n for kind, n in calls if kind == "verify"][0] == min(k, model_k or k) + 1


def test_min_confidence_stops_a_block_after_an_unsure_token(simulate):
    cost, calls = _counting()
    confidence = [1.0, 1.0, 0.1] + [1.0] * 7  # the draft is unsure of generated[2]
    simulate(PROMPT, GENERATED, GENERATED, confidence, PromptLookupDraft(64), 0.5, 4, cost)
    verify = [n for kind, n in calls if kind == "verify"]
    assert verify[0] == 3  # tokens 1 and 2 drafted, stopped after 2: 3 positions
    assert sum(n for kind, n in calls if kind == "draft") > 0


def test_wrong_draft_tokens_are_rejected_and_the_prompt_pass_placed(simulate):
    cost, calls = _counting()
    wrong = [t + 100 for t in GENERATED]
    assert simulate(PROMPT, GENERATED, wrong, [1.0] * 10, PromptLookupDraft(64), None, 3, cost) == 9
    assert calls[0] == ("draft", len(PROMPT) + 1)  # deferred: the first block feeds the prompt and token 0
    cost, calls = _counting()
    simulate(PROMPT, GENERATED, wrong, [1.0] * 10, PromptLookupDraft(64), None, 3, cost, defer_prefill=False)
    assert calls[0] == ("draft", 1)


def test_lookup_drafts_to_k_only_where_its_match_is_long_enough(simulate):
    prompt = [10, 1, 2, 3, 5, 6, 7, 8, 9, 20, 1, 2]
    generated = [3, 5, 6, 7, 8, 9, 30, 31]  # "1 2 3" occurred before ("20 1 2 3" did not): lookup proposes 5 6 7 8 9 20
    never = [99] * len(generated)
    for ngram_min, first_verify in ((3, 7), (4, 2)):  # a 3-gram match: lookup; a 4-gram is needed: the model's 1
        cost, calls = _counting()
        simulate(prompt, generated, never, [1.0] * len(generated), PromptLookupDraft(64, 8, ngram_min), None, 6,
                 cost, model_k=1)
        verify = [n for kind, n in calls if kind == "verify"]
        assert verify[0] == first_verify


def test_the_gguf_grid_takes_the_blocks_and_n_grams_asked_for():
    policies = runpy.run_path(str(BENCH / "hybrid_policy.py"))["policies"]
    grid = policies("gguf", (4, 8), (8, 12))
    assert {p[3] for p in grid} == {4, 8} and {p[1] for p in grid} == {8, 12}
    assert all(p[0] <= p[1] and (p[4] is None or p[4] < p[3]) for p in grid)
    assert {p[3] for p in policies("gguf")} == {2, 4, 6}  # the default grid as before


@pytest.mark.parametrize("extra, message", [(["--k", "9"], "--k takes blocks of 1..8 tokens"),
                                            (["--sort", "poetry"], "--sort takes geomean or one of --domains")])
def test_a_block_past_the_timed_passes_or_an_unknown_sort_is_refused(monkeypatch, capsys, extra, message):
    main = runpy.run_path(str(BENCH / "hybrid_policy.py"))["main"]
    monkeypatch.setattr("sys.argv", ["hybrid_policy.py", "--regime", "gguf", "--runs", "r", *extra])
    with pytest.raises(SystemExit):
        main()
    assert message in capsys.readouterr().err
