"""The draft A/B benchmark (bench/draft_ab.py): rows per prompt, k and method on tiny models; its table by hand."""

import pandas as pd
import pytest
import torch

from specdec.drafts import ModelDraft
from specdec.study.ab import AB_COLUMNS, draft_ab_table, run_draft_ab
from specdec.testing import perturbed_copy, tiny_qwen2


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
