"""A feature head's draft step in the machine fit's profiles: timed beside its target (one position on a cache of
`context_length`), its bytes those its drafting copy reads, and its c measured by the fit for every draft that
drafts with that vocabulary and dtype (not for a lookup mix, whose blocks are not head steps)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from specdec.gguf import quant
from specdec.drafts.feature_head import Q8_0, FeatureHeadDraft, untrained_head
from specdec.study.cost.model import fit_cost_model, predict_draft_cost_ratio, profiled_shapes
from specdec.study.cost.prediction import fitted_draft_costs, head_profile_name
from specdec.study.cost.profiling import _HeadProfileSession, profile_models
from specdec.testing import tiny_qwen2

VOCAB = 64


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(vocab_size=VOCAB, num_layers=2, seed=0)


def head_draft(target, rows: int, dtype=torch.float32) -> FeatureHeadDraft:
    return FeatureHeadDraft(untrained_head(target, range(rows)), target, dtype=dtype)


def expected_bytes(target, rows: int, element: int) -> int:
    """A head's weights counted by hand from the target's config: fc, q/k/v (with biases), o, gate/up/down, two
    norms, and the LM head's rows."""
    c = target.config
    h, i, kv = c.hidden_size, c.intermediate_size, c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    weights = 2 * h * h + (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h + rows * h
    return weights * element


@pytest.mark.parametrize("dtype, element", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_a_head_step_reads_its_layer_and_its_drafting_rows(target, dtype, element):
    assert head_draft(target, 16, dtype).step_bytes == expected_bytes(target, 16, element)
    assert head_draft(target, VOCAB, dtype).step_bytes == expected_bytes(target, VOCAB, element)


@pytest.mark.skipif(not quant.available(), reason="q8_0 needs specdec.native._quant (x86 with AVX2, FMA, F16C)")
def test_a_q8_0_head_step_reads_its_blocks():
    # Q8_0 rows need a width that is a multiple of 32 (and 16-row groups on AVX-512): a wider tiny target
    wide = tiny_qwen2(vocab_size=VOCAB, num_layers=1, hidden_size=64, seed=1)
    fp32 = head_draft(wide, 32).step_bytes
    q8 = head_draft(wide, 32, Q8_0).step_bytes
    # 34 bytes per 32 weights in the products; the norms (and biases) stay fp32
    assert 34 / 32 / 4 * fp32 < q8 < 0.3 * fp32


def test_a_head_profile_times_one_draft_step_on_a_full_cache(target):
    draft = head_draft(target, 16)
    tables = profile_models({"target": target, "head": draft}, context_length=12, positions=(1, 2, 3), repeats=3,
                            warmup=1)
    head = tables["head"]
    assert set(head["m"]) == {1} and set(head["component"]) == {"forward"} and len(head) == 3
    assert (head["seconds"] > 0).all() and (head["param_bytes"] == draft.step_bytes).all()
    assert head[["n_layers", "vocab_size", "context_length"]].drop_duplicates().values.tolist() == [[1, 16, 12]]
    assert head["dtype_bytes"].iloc[0] == pytest.approx(4, rel=0.02)  # its fc counted as the fit counts it
    assert set(tables["target"]["m"]) == {1, 2, 3}  # the target beside it as before


def test_the_timed_step_leaves_the_heads_cache_as_it_found_it(target):
    # every repeat sees the same cache: a step appends one position and the session crops it again
    draft = head_draft(target, 16)
    session = _HeadProfileSession(draft, 10, (1,), seed=0)
    assert session.cache.length == 10
    session.time_repeat(0)
    session.time_repeat(1)
    assert session.cache.length == 10 and len(session.rows) == 2


def head_profile(name: str, seconds: float, repeats: int = 5) -> pd.DataFrame:
    return pd.DataFrame([{"model": name, "component": "forward", "layer": None, "m": 1, "repeat": r,
                          "seconds": seconds, "param_bytes": 1, "n_layers": 1, "hidden_size": 32,
                          "intermediate_size": 64, "vocab_size": 16, "dtype_bytes": 2, "kv_dim": 16,
                          "context_length": 8} for r in range(repeats)])


def test_the_fit_measures_each_heads_c_by_the_profile_of_its_vocabulary_and_dtype(target):
    tables = profile_models({"target": target}, context_length=8, positions=(1, 2), repeats=3, warmup=0)
    # a second width for the fit (it needs two), then heads' steps at known times
    narrow = profile_models({"narrow": tiny_qwen2(vocab_size=VOCAB, num_layers=1, hidden_size=16, seed=2)},
                            context_length=8, positions=(1, 2), repeats=3, warmup=0)["narrow"]
    fit_profiles = pd.concat([tables["target"], narrow], ignore_index=True)
    step = fit_profiles[(fit_profiles.model == "target") & (fit_profiles.component == "forward")
                        & (fit_profiles.m == 1)]["seconds"].median()
    bf16, q8 = head_profile_name(16, "bfloat16"), head_profile_name(16, "q8_0")
    assert (bf16, q8) == ("feature-head-v16-bfloat16", "feature-head-v16-q8_0")
    everything = pd.concat([fit_profiles, head_profile(bf16, 0.1 * step), head_profile(q8, 0.05 * step)],
                           ignore_index=True)
    specs = {"head": {"kind": "feature_head", "vocab": 16, "dtype": "bfloat16"},
             "head-q8": {"kind": "feature_head", "head": "head", "dtype": "q8_0"},
             "head-mix": {"kind": "feature_head", "head": "head", "lookup": True},
             "head-fp32": {"kind": "feature_head", "head": "head", "dtype": "float32"}}
    fit = fit_cost_model(fit_profiles, n_boot=20)
    shape = profiled_shapes(fit_profiles)["target"]
    by = fitted_draft_costs(everything, "target", specs,
                            lambda s: predict_draft_cost_ratio(fit, s, shape)).set_index("draft")
    assert by.loc["head", "c_measured"] == pytest.approx(0.1)
    assert by.loc["head", "c_measured_by"] == f"profile of {bf16}"
    assert by.loc["head-q8", "c_measured"] == pytest.approx(0.05)
    assert np.isnan(by.loc["head-mix", "c_measured"])  # lookup where it matches: its blocks measure it
    assert np.isnan(by.loc["head-fp32", "c_measured"])  # no profile of an fp32 step of 16 rows
    assert by.loc["head", "draft_layers"] == 1 and by.loc["head", "c_predicted"] > 0

