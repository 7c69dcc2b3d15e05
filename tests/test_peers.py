"""The peers comparison: Hugging Face generate runs the model as shipped and agrees with our greedy loop; the table's
ratios by hand."""

import pandas as pd
import pytest
import torch

from specdec.decode import generate_baseline
from specdec.fp32.kernels import WeightMajorLinear, default_linear, use_weight_major_linear
from specdec.study.peers.hf import PEERS_COLUMNS, hf_generate, peers_table, run_peers_job
from specdec.testing import perturbed_copy, tiny_qwen2


def _pair():
    target = use_weight_major_linear(tiny_qwen2(vocab_size=64, hidden_size=32, seed=0, dtype=torch.float32,
                                                init_std=0.3, eos_token_id=2))
    return target, use_weight_major_linear(perturbed_copy(target, noise=0.05, seed=1))


def test_default_linear_swaps_back_and_forth():
    target, _ = _pair()
    with default_linear(target):
        assert not any(isinstance(m, WeightMajorLinear) for m in target.modules())
    assert sum(isinstance(m, WeightMajorLinear) for m in target.modules()) == 2 * 7 + 1  # 7 per layer + head


def test_hf_generate_and_assisted_match_our_greedy_tokens():
    target, draft = _pair()
    bf16_draft = perturbed_copy(draft, noise=0.0).to(torch.bfloat16)
    for prompt in ([3, 10, 20, 30, 11], [5, 6, 7]):
        ids = torch.tensor([prompt])
        ours = generate_baseline(target, ids, 10).tokens
        assert hf_generate(target, ids, 10, {2})[0] == ours
        assert hf_generate(target, ids, 10, {2}, draft=draft, k=3)[0] == ours
        # a draft held in bf16 (config `dtype: bfloat16`) next to an fp32 target: assisted generation takes it too
        assert hf_generate(target, ids, 10, {2}, draft=bf16_draft, k=3)[0] == ours


def test_run_peers_job_rows_and_table():
    target, draft = _pair()
    prompts = pd.DataFrame({"prompt_id": ["a", "b"], "input_ids": [[3, 10, 20, 30, 11], [5, 6, 7]]})
    runs = run_peers_job(target, draft, prompts, 3, 8, 2, {2}, log=lambda _: None)
    assert len(runs) == 2 * 2 * 4 and runs["same_tokens_as_ours_baseline"].all()
    table = peers_table(runs.assign(draft="d", domain="x", k=3))
    assert list(table.columns[:9]) == PEERS_COLUMNS and table.iloc[0]["n_pairs"] == 4


def test_peers_table_by_hand():
    rows = []
    for prompt, (hf, ours, hfa, spec) in {"p0": (2.0, 1.0, 3.0, 1.0), "p1": (3.0, 2.0, 4.0, 2.0),
                                          "p2": (1.0, 1.0, 1.0, 1.0)}.items():
        for method, seconds in zip(["hf_generate", "ours_baseline", "hf_assisted", "ours_spec"], [hf, ours, hfa, spec]):
            rows.append(dict(draft="d", domain="x", k=4, prompt_id=prompt, repeat=0, method=method,
                             s_per_token=seconds, same_tokens_as_ours_baseline=True))
    row = peers_table(pd.DataFrame(rows)).iloc[0]
    assert row["base_speed_ratio"] == pytest.approx(1.5)  # median of 2, 1.5, 1
    assert row["spec_speed_ratio"] == pytest.approx(2.0)  # median of 3, 2, 1
    assert row["hf_generate_s_per_token"] == pytest.approx(2.0) and row["ours_spec_s_per_token"] == pytest.approx(1.0)
    assert row["base_speed_ratio_lo"] <= row["base_speed_ratio"] <= row["base_speed_ratio_hi"]
