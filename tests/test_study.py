"""A decoding job at several k in one process (the draft sweep): one baseline timed next to every k, each k's
frames shaped as a single-k job's, greedy identity at every k."""

import pandas as pd
import pytest
import torch

from specdec.drafts import ModelDraft
from specdec.study.decoding.interleave import batch_of_one, run_in_rotation
from specdec.study.decoding.jobs import DecodeJob, run_decode_job, run_decode_jobs
from specdec.testing import perturbed_copy, tiny_qwen2

VOCAB = 64


@pytest.fixture(scope="module")
def pair():
    target = tiny_qwen2(vocab_size=VOCAB, seed=0)
    return target, ModelDraft(perturbed_copy(target, noise=0.05, seed=1))


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return pd.DataFrame({"prompt_id": [f"p{i}" for i in range(3)],
                         "input_ids": [torch.randint(0, VOCAB, (int(n),), generator=g).tolist() for n in (5, 9, 4)]})


JOB = DecodeJob(setting="greedy", draft="d", domain="code", k=1, seed=0, max_new_tokens=12, repeats=2)


def test_several_k_share_one_baseline_and_keep_greedy_identity(pair, prompts):
    target, draft = pair
    lines = []
    runs = run_decode_jobs(target, draft, prompts, JOB, [1, 3, 5], log=lines.append)
    single_steps, single_sequences = run_decode_job(target, draft, prompts, JOB)
    assert sorted(runs) == [1, 3, 5]
    baselines = []
    for k, (steps, sequences) in runs.items():
        assert list(sequences.columns) == list(single_sequences.columns)
        assert list(steps.columns) == list(single_steps.columns)
        assert (sequences["k"] == k).all() and (steps["k"] == k).all()
        assert len(sequences) == len(prompts) * JOB.repeats * 2
        spec = sequences[sequences["method"] == "speculative"]
        assert spec["identical"].all() and spec["n_tokens"].eq(JOB.max_new_tokens).all()
        blocks = steps[(steps["method"] == "speculative") & (steps["kind"] == "block")]
        assert blocks["drafted"].max() <= k and (blocks["drafted"] == k).any()
        baselines.append(sequences[sequences["method"] == "baseline"].set_index(["prompt_id", "repeat"]))
    # One baseline run per prompt and repeat, the same measured seconds under every k.
    for other in baselines[1:]:
        pd.testing.assert_series_equal(baselines[0]["total_seconds"], other["total_seconds"])
    # The single-k job produces the same tokens as the k = 1 frames of the multi-k job.
    assert runs[1][1]["tokens"].map(tuple).tolist() == single_sequences["tokens"].map(tuple).tolist()
    assert len(lines) == len(prompts) * JOB.repeats and all("k5" in line for line in lines)


def test_rotation_starts_one_method_later_each_turn():
    ran = []
    orders = [list(run_in_rotation(["a", "b", "c"], turn, lambda m: ran.append(m) or m.upper())) for turn in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert ran == [m for order in orders for m in order]  # each method runs once per turn, in that order
    assert run_in_rotation((None, 2), 1, lambda k: k) == {2: 2, None: None}
    ids = batch_of_one(pd.Series([3, 1, 4]).to_numpy())
    assert ids.dtype == torch.long and ids.tolist() == [[3, 1, 4]]
