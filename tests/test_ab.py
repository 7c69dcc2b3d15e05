"""The A/B benchmarks: the draft A/B (bench/draft_ab.py) on tiny models and its table by hand; the kernel A/B
(bench/kernel_ab.py): its summary by hand and its draft arguments."""

import pandas as pd
import pytest
import torch

from specdec.drafts import ModelDraft
from specdec.study.decoding.ab import AB_COLUMNS, draft_ab_table, run_draft_ab
from specdec.testing import perturbed_copy, tiny_qwen2
from scripts import load_script


def test_run_draft_ab_on_tiny_models():
    target = tiny_qwen2(vocab_size=64, hidden_size=32, seed=0, init_std=0.3)
    draft = perturbed_copy(target, noise=0.05, seed=1)
    drafts = {"float32": ModelDraft(draft), "bfloat16": ModelDraft(perturbed_copy(draft, 0.0).to(torch.bfloat16))}
    prompts = pd.DataFrame({"prompt_id": ["a", "b"], "input_ids": [[3, 10, 20, 30, 11], [5, 6, 7]]})
    runs = run_draft_ab(target, drafts, prompts, [2, 3], 10, log=lambda _: None)
    assert len(runs) == 2 * 2 * 3 and runs["identical"].all()
    table = draft_ab_table(runs)
    assert list(table.columns) == AB_COLUMNS
    assert sorted(zip(table["variant"], table["k"])) == [("bfloat16", 2), ("bfloat16", 3), ("float32", 2),
                                                         ("float32", 3)]
    assert (table["n_prompts"] == 2).all() and (table["draft_step_ms"] > 0).all() and table["c"].notna().all()


def test_draft_ab_table_by_hand():
    rows = []
    for prompt, (base, a, b) in {"p0": (2.0, 1.0, 4.0), "p1": (3.0, 1.0, 3.0), "p2": (4.0, 1.0, 2.0)}.items():
        for method, seconds, draft_step in (("baseline", base, float("nan")), ("a", a, 0.01), ("b", b, 0.03)):
            rows.append(dict(prompt_id=prompt, k=4, method=method, seconds=seconds, acceptance=0.5,
                             tokens_per_pass=2.0, step_seconds=0.1, draft_step_seconds=draft_step, identical=True))
    table = draft_ab_table(pd.DataFrame(rows)).set_index("variant")
    assert table.loc["a", "speedup_median"] == pytest.approx(3.0)  # median of 2, 3, 4
    assert table.loc["b", "speedup_median"] == pytest.approx(1.0)  # median of 0.5, 1, 2
    assert table.loc["a", "c"] == pytest.approx(0.1) and table.loc["b", "c"] == pytest.approx(0.3)
    assert table.loc["a", "speedup_lo"] <= 3.0 <= table.loc["a", "speedup_hi"]


def test_kernel_ab_summary_by_hand():
    """Speedups per prompt over the same kernel's plain run and over the first kernel's, then the median."""
    kab = load_script("bench/kernel_ab.py")
    rows = []
    plain = {("p0", "k1"): 4.0, ("p1", "k1"): 6.0, ("p2", "k1"): 8.0, ("p0", "k2"): 2.0, ("p1", "k2"): 3.0,
             ("p2", "k2"): 4.0}
    spec = {"k1": 2.0, "k2": 1.0}  # k1's draft halves its plain time, k2's does too, and k2 is twice as fast
    for (prompt, kernel), seconds in plain.items():
        for method, k, secs in (("plain", 0, seconds), ("model", 4, seconds / 2)):
            rows.append(dict(prompt_id=prompt, kernel=kernel, method=method, k=k, generation_seconds=secs,
                             tokens_per_second=100 / secs, prompt_pass_seconds=spec[kernel], acceptance=0.5,
                             tokens_per_pass=2.0, identical=True))
    table = kab.summarise(pd.DataFrame(rows), ["k1", "k2"]).set_index(["kernel", "method"])
    assert table.loc[("k1", "model"), "speedup_own_plain"] == pytest.approx(2.0)
    assert table.loc[("k2", "model"), "speedup_own_plain"] == pytest.approx(2.0)
    assert table.loc[("k2", "plain"), "speedup_vs_first_plain"] == pytest.approx(2.0)
    assert table.loc[("k2", "model"), "speedup_vs_first_plain"] == pytest.approx(4.0)
    assert table.loc[("k1", "plain"), "prompt_pass_ms"] == pytest.approx(2000.0)
    assert table["all_identical"].all()


def test_kernel_ab_refuses_a_draft_it_does_not_know():
    kab = load_script("bench/kernel_ab.py")
    assert kab.parse_draft("lookup:4") == ("lookup", 4)
    for bad in ("lookup", "model:0", "tree:2", "model:x"):
        with pytest.raises(Exception, match="a draft is KIND:K"):
            kab.parse_draft(bad)
