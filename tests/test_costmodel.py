"""The cost model: fits on synthetic profiles with known terms, the verdict, the speedup algebra, the audit of a
hand-made steps table, and the profiler on a tiny random model."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from specdec.study.cost.model import (
    QWEN25_0_5B,
    QWEN25_1_5B,
    TERMS,
    ModelShape,
    audited_step_timings,
    depth_vs_parameters_verdict,
    expected_catchup_rate,
    expected_tokens_per_pass,
    fit_cost_model,
    pooled_rates,
    predict_draft_cost_ratio,
    predict_step_time,
    predicted_speedup,
    profiled_shapes,
    verify_cost,
)
from specdec.study.cost.verdict import (
    DRAFT_COLUMNS,
    MACHINE_COLUMNS,
    MachineFit,
    best_drafts_by_machine,
    machines_tables,
    predicted_cells,
    verdict_text,
)
from specdec.study.cost.prediction import (
    DRAFTS_COLUMNS,
    FITTED_DRAFT_COLUMNS,
    DRAFTS_EXTRA_COLUMNS,
    best_per_domain,
    draft_shapes,
    drafts_table,
    early_exit_seconds,
    fitted_draft_costs,
    profiled_costmodel_table,
    roofline,
)
from specdec.study.cost.profiling import memory_bandwidth, param_bytes, profile_model, profile_models
from specdec.testing import tiny_qwen2

POSITIONS = (1, 2, 3, 5, 9)
WIDTHS = [ModelShape(24, 896, 4864, 151936, 4, 128), ModelShape(28, 1536, 8960, 151936, 4, 256),
          ModelShape(16, 1152, 6144, 151936, 4, 256), ModelShape(20, 2048, 11008, 151936, 4, 256)]
# Two machines: per-layer overhead (s), layer seconds per byte, head overhead, head seconds per byte, fixed (m = 1).
OVERHEAD_BOUND = dict(a=2e-3, b=1 / 1e12, c=1e-4, d=1 / 1e12, fixed=3e-3)
BANDWIDTH_BOUND = dict(a=2e-5, b=1 / 30e9, c=1e-4, d=1 / 30e9, fixed=1e-3)


def true_terms(machine: dict, m: int) -> dict:
    """Known terms at m positions: bytes terms grow 10% per extra position, overheads 5%, fixed 2%."""
    return {"fixed": machine["fixed"] * (1 + 0.02 * (m - 1)),
            "layer_overhead": machine["a"] * (1 + 0.05 * (m - 1)),
            "layer_seconds_per_byte": machine["b"] * (1 + 0.1 * (m - 1)),
            "head_overhead": machine["c"] * (1 + 0.05 * (m - 1)),
            "head_seconds_per_byte": machine["d"] * (1 + 0.1 * (m - 1))}


def synthetic_profile(machine: dict, shapes=WIDTHS, repeats: int = 10, noise: float = 0.05, drift: float = 0.02,
                      seed: int = 0) -> pd.DataFrame:
    """profile_model-shaped rows from known terms: 5% noise per component and a 2% drift per (model, repeat)
    common to all its components; the whole forward is the sum of its (noisy) parts."""
    rng = np.random.default_rng(seed)
    rows = []
    for index, shape in enumerate(shapes):
        info = dict(model=f"w{index}", n_layers=shape.n_layers, hidden_size=shape.hidden,
                    intermediate_size=shape.intermediate, vocab_size=shape.vocab, dtype_bytes=shape.dtype_bytes)
        for repeat in range(repeats):
            scale = 1 + drift * rng.standard_normal()
            for m in POSITIONS:
                t = true_terms(machine, m)

                def noisy(value, size=None):
                    return value * scale * (1 + noise * rng.standard_normal(size))

                layers = noisy(t["layer_overhead"] + t["layer_seconds_per_byte"] * shape.layer_bytes, shape.n_layers)
                head = noisy(t["head_overhead"] + t["head_seconds_per_byte"] * shape.head_bytes)
                fixed = noisy(t["fixed"])
                parts = [("embedding", None, 0.2 * fixed, 0), ("norm", None, 0.1 * fixed, 0),
                         ("lm_head", None, head, shape.head_bytes),
                         ("forward", None, fixed + layers.sum() + head, shape.step_bytes)]
                parts += [("layer", i, s, shape.layer_bytes) for i, s in enumerate(layers)]
                rows += [dict(info, component=c, layer=layer, m=m, repeat=repeat, seconds=float(s), param_bytes=b)
                         for c, layer, s, b in parts]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def bandwidth_fit():
    return fit_cost_model(synthetic_profile(BANDWIDTH_BOUND), n_boot=500)


@pytest.fixture(scope="module")
def overhead_fit():
    return fit_cost_model(synthetic_profile(OVERHEAD_BOUND, seed=1), n_boot=500)


@pytest.mark.parametrize("machine_name", ["bandwidth", "overhead"])
def test_fit_recovers_known_terms(machine_name, bandwidth_fit, overhead_fit):
    fit, machine = (bandwidth_fit, BANDWIDTH_BOUND) if machine_name == "bandwidth" else (overhead_fit, OVERHEAD_BOUND)
    covered = []
    for m in POSITIONS:
        truth = true_terms(machine, m)
        for name in TERMS:
            term = fit.term(name, m)
            covered.append(term.lo <= truth[name] <= term.hi)
            assert term.lo <= term.estimate <= term.hi
        # The terms that carry a step are recovered closely; the small ones (head overhead, fixed) are checked
        # through their intervals only.
        dominant = ["layer_seconds_per_byte", "head_seconds_per_byte"] if machine_name == "bandwidth" \
            else ["layer_overhead"]
        for name in dominant:
            assert fit.term(name, m).estimate == pytest.approx(truth[name], rel=0.05), (name, m)
    # 95% intervals: allow the odd miss among 25 (m, term) pairs, not a systematic one.
    assert np.mean(covered) >= 0.85, np.mean(covered)


def test_fit_point_estimate_is_least_squares(bandwidth_fit):
    profile = synthetic_profile(BANDWIDTH_BOUND)
    layers = profile[(profile.component == "layer") & (profile.m == 1)]
    points = layers.groupby(["model", "repeat"]).agg(x=("param_bytes", "first"), y=("seconds", "median"))
    line = stats.linregress(points["x"], points["y"])
    assert bandwidth_fit.term("layer_overhead").estimate == pytest.approx(line.intercept, rel=1e-9)
    assert bandwidth_fit.term("layer_seconds_per_byte").estimate == pytest.approx(line.slope, rel=1e-9)
    assert bandwidth_fit.bandwidth_eff(1) == pytest.approx(30e9, rel=0.05)


def true_step(machine: dict, shape: ModelShape, m: int) -> float:
    t = true_terms(machine, m)
    return (t["fixed"] + shape.n_layers * (t["layer_overhead"] + t["layer_seconds_per_byte"] * shape.layer_bytes)
            + t["head_overhead"] + t["head_seconds_per_byte"] * shape.head_bytes)


def test_predictions_and_measured_verify_cost(bandwidth_fit):
    s = QWEN25_1_5B
    predicted = predict_step_time(bandwidth_fit, s.n_layers, s.hidden, s.intermediate, s.vocab, 4, m=5, kv_dim=256)
    assert predicted == pytest.approx(true_step(BANDWIDTH_BOUND, s, 5), rel=0.03)
    # Measured T(5)/T(1) of the largest profiled model (w3) against the synthetic truth.
    truth = true_step(BANDWIDTH_BOUND, WIDTHS[3], 5) / true_step(BANDWIDTH_BOUND, WIDTHS[3], 1)
    ratio = verify_cost(bandwidth_fit, 5)
    assert ratio.lo <= truth <= ratio.hi
    assert ratio.estimate == pytest.approx(truth, rel=0.03)
    with pytest.raises(KeyError):
        predict_step_time(bandwidth_fit, 28, 1536, 8960, 151936, 4, m=4)


def test_fit_needs_two_widths():
    one = synthetic_profile(BANDWIDTH_BOUND, shapes=WIDTHS[:1], repeats=3)
    with pytest.raises(ValueError, match="two different widths"):
        fit_cost_model(one, n_boot=10)


def test_verdict_flips_between_machines(bandwidth_fit, overhead_fit):
    drafts = {"qwen2.5-0.5b": QWEN25_0_5B, "shallow": ModelShape(4, 1536, 8960, 151936, 4, 256)}
    depth = depth_vs_parameters_verdict(overhead_fit, QWEN25_1_5B, drafts)
    params = depth_vs_parameters_verdict(bandwidth_fit, QWEN25_1_5B, drafts)
    assert depth.regime == "depth" and params.regime == "parameters"
    assert overhead_fit.dominant == "per-layer overhead" and bandwidth_fit.dominant == "bytes"
    qwen_depth, qwen_params = depth.table.set_index("model"), params.table.set_index("model")
    assert qwen_depth.loc["target", "depth_share"] > 0.8 and qwen_params.loc["target", "bytes_share"] > 0.8
    # The seed's pair: c near the depth ratio (24/28) on one machine, near the parameter ratio on the other.
    assert qwen_depth.loc["qwen2.5-0.5b", "c_closer_to"] == "depth"
    assert qwen_params.loc["qwen2.5-0.5b", "c_closer_to"] == "parameters"
    c = predict_draft_cost_ratio(bandwidth_fit, QWEN25_0_5B, QWEN25_1_5B)
    assert qwen_params.loc["qwen2.5-0.5b", "c"] == pytest.approx(c)
    assert qwen_params.loc["qwen2.5-0.5b", "c_lo"] <= c <= qwen_params.loc["qwen2.5-0.5b", "c_hi"]
    assert c == pytest.approx(QWEN25_0_5B.step_bytes / QWEN25_1_5B.step_bytes, rel=0.1)
    assert "verdict: the depth ratio" in depth.text and "verdict: the parameter ratio" in params.text


def test_expected_tokens_per_pass():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_per_pass(1 - 1e-12, 3) == pytest.approx(4.0)
    assert expected_catchup_rate(0.5, 3) == 0.125
    with pytest.raises(ValueError):
        expected_tokens_per_pass(1.5, 2)


def test_predicted_speedup_by_hand():
    # 3 tokens per pass; block = 4 draft steps of 0.02 + verify 0.3 + 25% x (0.05 - 0.02) extra catch-up cost.
    block = 4 * 0.02 + 0.3 + 0.25 * 0.03
    assert predicted_speedup(3.0, 0.25, 0.02, 0.3, 0.05, 0.25, k=4) == pytest.approx(3.0 * 0.25 / block)
    # No catch-ups: an undefined catch-up time does not matter.
    assert predicted_speedup(2.0, 0.1, 0.01, 0.12, float("nan"), 0.0, k=2) == pytest.approx(0.2 / 0.14)


def hand_steps() -> tuple[pd.DataFrame, pd.DataFrame]:
    """One job (k = 3), two prompts with the same passes. Speculative blocks, in order:
    full accept (3 one-token calls, 0.03 s each); catch-up (2 tokens, 0.05 s) + 2 calls of 0.04 s; full accept
    (3 x 0.05 s); catch-up (2 tokens, 0.07 s) with drafted = 1, so no one-token call."""
    job = dict(setting="greedy", draft="d", domain="code", k=3, seed=0, temperature=0.0, repeat=0)
    cols = ["method", "kind", "drafted", "accepted", "emitted", "positions", "draft_seconds", "catchup_seconds",
            "catchup_tokens", "verify_seconds", "decide_seconds"]
    spec = [("speculative", "prefill", 0, 0, 1, 1, 0.5, 0.0, 0, 1.2, 0.0),
            ("speculative", "block", 3, 3, 4, 4, 0.09, 0.0, 0, 0.20, 0.01),
            ("speculative", "block", 3, 1, 2, 4, 0.08, 0.05, 2, 0.22, 0.01),
            ("speculative", "block", 3, 3, 4, 4, 0.15, 0.0, 0, 0.24, 0.01),
            ("speculative", "block", 1, 0, 1, 2, 0.0, 0.07, 2, 0.15, 0.01)]
    base = [("baseline", "prefill", 0, 0, 1, 1, 0.0, 0.0, 0, 1.0, 0.0)]
    base += [("baseline", "target", 0, 0, 1, 1, 0.0, 0.0, 0, t, 0.0) for t in [0.11] * 5 + [0.10] * 3 + [0.12] * 3]
    steps = pd.concat([pd.DataFrame(spec + base, columns=cols).assign(prompt_id=p, **job) for p in ("p0", "p1")])
    totals = {"p0": (2.4, 2.0), "p1": (2.6, 2.5)}
    sequences = pd.DataFrame(
        [dict(job, prompt_id=p, method="baseline", n_tokens=12, target_passes=12, drafted=0, accepted=0,
              total_seconds=b) for p, (b, _) in totals.items()]
        + [dict(job, prompt_id=p, method="speculative", n_tokens=12, target_passes=5, drafted=10, accepted=7,
                total_seconds=s) for p, (_, s) in totals.items()])
    return steps, sequences


def test_audited_step_timings_by_hand():
    steps, _ = hand_steps()
    row = audited_step_timings(steps).iloc[0]
    assert (row["draft"], row["domain"], row["k"], row["n_blocks"]) == ("d", "code", 3, 8)
    assert row["draft_step_seconds"] == pytest.approx(0.04)  # median of 0.03, 0.04, 0.05 (per call)
    assert row["catchup_call_seconds"] == pytest.approx(0.06)
    assert row["catchup_tokens_mean"] == 2 and row["catchup_rate"] == 0.5
    assert row["verify_seconds"] == pytest.approx(0.22)  # positions = k + 1 only
    assert row["target_step_seconds"] == pytest.approx(0.11)
    assert row["c"] == pytest.approx(0.04 / 0.11) and row["verify_cost_ratio"] == pytest.approx(2.0)
    assert row["decode_tokens_per_pass"] == pytest.approx(11 / 4)
    assert row["prefill_target_seconds"] == pytest.approx(1.1) and row["prefill_draft_seconds"] == 0.5
    # what the blocks cost on average: (0.09 + 0.08 + 0.15 + 0) / 4 drafting, (0.05 + 0.07) / 4 catching up
    assert row["draft_seconds_per_block"] == pytest.approx(0.08)
    assert row["catchup_seconds_per_block"] == pytest.approx(0.03)


def test_pooled_rates_and_closed_form_on_audited_timings_by_hand():
    steps, sequences = hand_steps()
    row = pooled_rates(sequences).iloc[0]
    assert row["acceptance"] == pytest.approx(0.7) and row["tokens_per_pass"] == pytest.approx(12 / 5)
    assert row["measured_speedup"] == pytest.approx((2.4 / 2.0 + 2.6 / 2.5) / 2)
    audit = audited_step_timings(steps).iloc[0]
    block = 3 * 0.04 + 0.22 + 0.5 * (0.06 - 0.04)
    predicted = predicted_speedup(audit["decode_tokens_per_pass"], audit["target_step_seconds"],
                                  audit["draft_step_seconds"], audit["verify_seconds"],
                                  audit["catchup_call_seconds"], audit["catchup_rate"], k=3)
    assert predicted == pytest.approx(2.75 * 0.11 / block)


@pytest.fixture(scope="module")
def tiny_profiles():
    torch.set_num_threads(1)
    models = {"narrow": tiny_qwen2(dtype=torch.float32), "wide": tiny_qwen2(hidden_size=64, dtype=torch.float32)}
    tables = {name: profile_model(model, context_length=16, positions=(1, 2, 3), repeats=3, name=name)
              for name, model in models.items()}
    return models, tables


def test_profile_model_on_tiny_model(tiny_profiles):
    models, tables = tiny_profiles
    model, table = models["narrow"], tables["narrow"]
    n_layers = len(model.model.layers)
    assert len(table) == (n_layers + 4) * 3 * 3
    counts = table.groupby(["component", "m"]).size()
    assert (counts.loc["layer"] == n_layers * 3).all() and (counts.drop("layer") == 3).all()
    assert (table["seconds"] > 0).all()
    layers = table[table.component == "layer"]
    for index, layer in enumerate(model.model.layers):
        assert (layers[layers.layer == index]["param_bytes"] == param_bytes(layer)).all()
    assert (layers["param_bytes"] == ModelShape.from_config(model.config).layer_bytes).all()
    head = table[table.component == "lm_head"]
    assert (head["param_bytes"] == ModelShape.from_config(model.config).head_bytes).all()
    # The parts of a forward fit inside it.
    sums = table[table.component != "forward"].groupby(["m", "repeat"])["seconds"].sum()
    assert (sums <= table[table.component == "forward"].set_index(["m", "repeat"])["seconds"]).all()
    # m interleaved: the first repeat runs every m before the second repeat starts.
    forwards = table[table.component == "forward"]
    assert set(forwards["m"]) == {1, 2, 3} and set(forwards["repeat"]) == {0, 1, 2}
    # Two widths are enough for a fit.
    fit = fit_cost_model(pd.concat(tables.values()), n_boot=50)
    assert np.isfinite(fit.terms["estimate"]).all() and set(fit.verify["model"]) == {"narrow", "wide"}


def test_profile_models_interleaves_the_models_repeat_by_repeat(tiny_profiles):
    models, _ = tiny_profiles
    calls = []  # (model, new positions) of every forward, in the order they ran
    handles = [model.register_forward_pre_hook(lambda _, args, kwargs, name=name: calls.append(
        (name, kwargs["input_ids"].shape[1])), with_kwargs=True) for name, model in models.items()]
    try:
        tables = profile_models(models, context_length=16, positions=(1, 2), repeats=4, warmup=0)
    finally:
        for handle in handles:
            handle.remove()
    timed = [name for name, m in calls if m <= 2]  # the 16-token cache fills are not timed
    # Each repeat times every model once (2 forwards each); the order of models turns round from one repeat to the next.
    assert timed == ["narrow"] * 2 + ["wide"] * 2 + ["wide"] * 2 + ["narrow"] * 2 + ["narrow"] * 2 + ["wide"] * 2 \
        + ["wide"] * 2 + ["narrow"] * 2
    assert set(tables) == {"narrow", "wide"} and (tables["wide"]["model"] == "wide").all()
    assert set(tables["narrow"]["repeat"]) == {0, 1, 2, 3}
    assert tables["wide"]["hidden_size"].iloc[0] == 64 and tables["narrow"]["hidden_size"].iloc[0] != 64
    with pytest.raises(ValueError, match="no model"):
        profile_models({})


def test_memory_bandwidth_is_positive():
    assert memory_bandwidth(4 * 2**20, repeats=2) > 0


def hand_profiles() -> pd.DataFrame:
    """Forward seconds by m for a target 't' (3 layers of 0.03 s at m = 1) and a draft model 'dm', 3 repeats."""
    rows = []
    for repeat in range(3):
        for m, seconds in {1: 0.10, 2: 0.12, 3: 0.15, 4: 0.20}.items():
            rows.append(dict(model="t", component="forward", layer=None, m=m, repeat=repeat, seconds=seconds))
            for layer in range(3):
                rows.append(dict(model="t", component="layer", layer=layer, m=m, repeat=repeat, seconds=0.03))
        for m, seconds in {1: 0.02, 2: 0.03}.items():
            rows.append(dict(model="dm", component="forward", layer=None, m=m, repeat=repeat, seconds=seconds))
    return pd.DataFrame(rows)


def test_profiled_costmodel_table_by_hand():
    steps, sequences = hand_steps()
    profiles = hand_profiles()
    specs = {"d": {"kind": "model", "model": "dm"}}
    row = profiled_costmodel_table(profiles, steps, sequences, "t", specs).iloc[0]
    assert list(profiled_costmodel_table(profiles, steps, sequences, "t", specs).columns[:10]) == [
        "draft", "domain", "k", "acceptance", "tokens_per_pass", "c", "verify_cost_ratio", "predicted_speedup",
        "measured_speedup", "rel_error"]
    assert row["c"] == pytest.approx(0.2) and row["verify_cost_ratio"] == pytest.approx(2.0)  # T(4) / T(1)
    block = 3 * 0.02 + 0.20 + 0.5 * (0.03 - 0.02)  # the formula: k draft steps, a verify over k + 1
    assert row["predicted_decode_speedup"] == pytest.approx(2.75 * 0.10 / block)
    # Whole sequences price the blocks as they ran: 3, 3, 3 and 1 drafted; verify over 4, 4, 4 and 2 positions.
    assert row["drafted_per_block"] == pytest.approx(2.5)
    block_as_run = 2.5 * 0.02 + (3 * 0.20 + 0.12) / 4 + 0.5 * (0.03 - 0.02)
    baseline = 1.1 + 11 * 0.10
    assert row["predicted_speedup"] == pytest.approx(baseline / (1.1 + 0.5 + 11 / 2.75 * block_as_run))
    assert row["rel_error"] == pytest.approx(row["predicted_speedup"] / row["measured_speedup"] - 1)
    assert row["c_measured"] == pytest.approx(0.04 / 0.11)
    # An early exit after 1 of the target's 3 layers costs the forward minus the 2 skipped layers.
    early = early_exit_seconds(profiles[profiles["model"] == "t"], 1)
    assert early.loc[1] == pytest.approx(0.10 - 0.06) and early.loc[2] == pytest.approx(0.12 - 0.06)
    lookup = profiled_costmodel_table(profiles, steps, sequences, "t", {"d": {"kind": "prompt_lookup"}}).iloc[0]
    # No profiled forward: the blocks are priced at what they measured, on average (not at the median call, which
    # is 0 for a hybrid whose blocks are mostly free lookups): 0.08 s drafting over 2.5 drafted tokens, 0.03 s
    # catching up, per block.
    assert lookup["c"] == pytest.approx(0.08 / 2.5 / 0.10)
    assert lookup["predicted_speedup"] == pytest.approx(baseline / (1.1 + 0.5 + 11 / 2.75 * (0.08 + 0.03 + 0.18)))
    closed_form_block = 3 * 0.032 + 0.20 + 0.5 * (0.03 / 0.5)  # the catch-up term carries the mean catch-up
    assert lookup["predicted_decode_speedup"] == pytest.approx(2.75 * 0.10 / closed_form_block)
    # A model draft held in another dtype than the profiled one is priced at its measured blocks too, not at the
    # profile of its fp32 weights.
    bf16 = {"d": {"kind": "model", "model": "dm", "dtype": "bfloat16"}}
    assert profiled_costmodel_table(profiles, steps, sequences, "t", bf16).iloc[0]["c"] == pytest.approx(0.032 / 0.10)
    assert profiled_costmodel_table(profiles, steps, sequences, "t", bf16, profiled_dtype="bfloat16").iloc[0][
        "c"] == pytest.approx(0.2)
    # The decoding phase alone (prompt passes left out): the baseline's 11 steps (1.21 s) over the blocks' draft,
    # catch-up, verify and decide seconds (1.25 + 4 x 0.01 s).
    assert lookup["measured_decode_speedup"] == pytest.approx(1.21 / 1.29)


def test_drafts_table_shapes_by_kind_and_dtype():
    target = QWEN25_1_5B
    specs = {"fp32": {"kind": "model", "model": "m"}, "bf16": {"kind": "model", "model": "m", "dtype": "bfloat16"},
             "self4": {"kind": "early_exit", "layers": 4}, "lookup": {"kind": "prompt_lookup"}}
    shapes = draft_shapes(specs, {"m": QWEN25_0_5B, "t": target}, "t")
    assert shapes["bf16"].step_bytes * 2 == shapes["fp32"].step_bytes and shapes["bf16"].n_layers == 24
    assert shapes["self4"].n_layers == 4 and shapes["self4"].hidden == target.hidden and shapes["lookup"] is None
    cells = pd.DataFrame([dict(draft=d, domain="code", k=4, acceptance=0.5, tokens_per_pass=2.0, c_measured=0.3,
                               measured_speedup=s, n_prompts=2, predicted_speedup=1.0)
                          for d, s in [("fp32", 1.2), ("bf16", 1.5), ("self4", 0.7), ("lookup", 1.1)]])
    table = drafts_table(cells, specs, shapes, target, lambda shape: shape.step_bytes / target.step_bytes,
                         run="sweep")
    assert list(table.columns) == DRAFTS_COLUMNS + DRAFTS_EXTRA_COLUMNS and (table["run"] == "sweep").all()
    by_draft = table.set_index("draft")
    assert by_draft.loc["bf16", "param_ratio"] == pytest.approx(by_draft.loc["fp32", "param_ratio"] / 2)
    assert by_draft.loc["bf16", "c_predicted"] == pytest.approx(by_draft.loc["bf16", "param_ratio"])
    assert by_draft.loc["self4", "depth_ratio"] == pytest.approx(4 / 28)
    assert by_draft.loc["lookup", "draft_layers"] == 0 and by_draft.loc["lookup", "param_ratio"] == 0.0
    best = best_per_domain(table)
    assert best.loc[0, "draft"] == "bf16" and best.loc[0, "run"] == "sweep" and best.loc[0, "n_prompts"] == 2


def test_a_feature_head_is_priced_as_one_target_layer_with_its_fc_and_its_drafting_rows():
    target = QWEN25_1_5B
    specs = {"head": {"kind": "feature_head", "vocab": 8192, "dtype": "bfloat16"},
             "head-hybrid": {"kind": "feature_head", "head": "head", "lookup": True},
             "whole": {"kind": "feature_head"}}
    shapes = draft_shapes(specs, {"t": target}, "t")
    head = shapes["head"]
    h = target.hidden
    assert head.n_layers == 1 and head.vocab == 8192 and head.dtype_bytes == 2
    assert head.layer_params == ModelShape(1, h, target.intermediate, 8192, 2, target.kv_dim).layer_params + 2 * h * h
    assert head.step_bytes == pytest.approx((head.layer_params + 8192 * h) * 2)
    assert shapes["head-hybrid"] == head  # its base's vocabulary and dtype
    assert shapes["whole"].vocab == target.vocab and shapes["whole"].dtype_bytes == 4
    # the head's depth ratio is 1 / 28, its bytes a small share of the target's
    assert head.step_bytes / target.step_bytes < 0.05


def test_roofline_by_hand():
    steps, _ = hand_steps()
    profiles = hand_profiles().assign(param_bytes=1000)
    table = roofline(profiles, 1e6, "t", steps).set_index("m")
    assert table.loc[1, "weight_bytes"] == 3000 and table.loc[1, "floor_seconds"] == pytest.approx(3e-3)
    assert table.loc[1, "decode_seconds"] == pytest.approx(0.11)  # baseline one-token steps
    assert table.loc[4, "decode_seconds"] == pytest.approx(0.22)  # verify passes over 4 positions
    assert table.loc[4, "profiled_over_floor"] == pytest.approx(0.20 / 3e-3)


# --- per machine: the fit without decoding, the verdict across machines, the best draft per machine --------------
MACHINE_DRAFTS = {"w0": {"kind": "model", "model": "w0"},
                  "w0-bf16": {"kind": "model", "model": "w0", "dtype": "bfloat16"},
                  "w0-cut6": {"kind": "truncated", "model": "w0", "layers": 6},
                  "self-4": {"kind": "early_exit", "layers": 4},
                  "lookup": {"kind": "prompt_lookup"}, "elsewhere": {"kind": "model", "model": "not-profiled"},
                  "hybrid": {"kind": "hybrid", "model": "w0", "dtype": "bfloat16"}}


def machine_profile(machine: dict, seed: int) -> pd.DataFrame:
    profile = synthetic_profile(machine, seed=seed)
    return profile.assign(kv_dim=profile["model"].map({f"w{i}": s.kv_dim for i, s in enumerate(WIDTHS)}))


def fitted_machine(machine: dict, seed: int):
    """(fit, fitted_draft_costs table) of a synthetic machine whose target is w1 (the 1.5B shape)."""
    profile = machine_profile(machine, seed)
    fit = fit_cost_model(profile, n_boot=200)
    target = profiled_shapes(profile)["w1"]
    return fit, fitted_draft_costs(profile, "w1", MACHINE_DRAFTS, lambda s: predict_draft_cost_ratio(fit, s, target))


@pytest.fixture(scope="module")
def two_machines():
    return {"bandwidth": fitted_machine(BANDWIDTH_BOUND, 0), "overhead": fitted_machine(OVERHEAD_BOUND, 1)}


def test_fitted_draft_costs_price_every_draft_the_profiles_can(two_machines):
    profile = machine_profile(BANDWIDTH_BOUND, 0)
    fit, table = two_machines["bandwidth"]
    assert list(table.columns) == FITTED_DRAFT_COLUMNS
    by = table.set_index("draft")
    assert "elsewhere" not in by.index  # its model was not profiled: nothing to price it with
    forward = profile[(profile.component == "forward") & (profile.m == 1)].groupby("model")["seconds"].median()
    assert by.loc["w0", "c_measured"] == pytest.approx(forward["w0"] / forward["w1"])
    assert by.loc["w0", "c_measured_by"] == "profile"
    # On data that follows the model, the fit's c agrees with the profiled c, for a model and for an early exit.
    for draft in ("w0", "self-4"):
        assert by.loc[draft, "c_predicted"] == pytest.approx(by.loc[draft, "c_measured"], rel=0.05), draft
    # A dtype or a cut the profiles did not run: priced by the fit only, from its shape.
    assert np.isnan(by.loc["w0-bf16", "c_measured"]) and pd.isna(by.loc["w0-bf16", "c_measured_by"])
    assert by.loc["w0-bf16", "param_ratio"] == pytest.approx(by.loc["w0", "param_ratio"] / 2)
    assert by.loc["w0-bf16", "c_predicted"] < by.loc["w0", "c_predicted"]
    assert by.loc["w0-cut6", "draft_layers"] == 6 and np.isnan(by.loc["w0-cut6", "c_measured"])
    assert by.loc["w0-cut6", "depth_ratio"] == pytest.approx(6 / 28)
    assert by.loc["self-4", "draft_layers"] == 4 and by.loc["lookup", "c_predicted"] == 0.0
    assert np.isnan(by.loc["hybrid", "c_measured"])  # a mix of lookup and model: its blocks measure it


def test_a_cut_that_was_not_profiled_takes_the_c_of_a_profiled_cut_with_its_shapes():
    # w2 is w0's first 6 layers, profiled as a model of its own (a truncated draft's directory); a distilled 6-layer
    # cut of w0 runs the same products over the same bytes, a 12-layer cut does not, nor does a hybrid.
    shapes = [WIDTHS[0], WIDTHS[1], dataclasses.replace(WIDTHS[0], n_layers=6)]
    profile = synthetic_profile(BANDWIDTH_BOUND, shapes=shapes, seed=2)
    profile = profile.assign(kv_dim=profile["model"].map({f"w{i}": s.kv_dim for i, s in enumerate(shapes)}))
    specs = {"w0": {"kind": "model", "model": "w0"}, "w2": {"kind": "truncated", "model": "w0", "layers": 6},
             "cut6-distilled": {"kind": "distilled", "model": "w0", "layers": 6},
             "cut12-distilled": {"kind": "distilled", "model": "w0", "layers": 12},
             "hybrid-fp32": {"kind": "hybrid", "model": "w0"}}
    fit = fit_cost_model(profile, n_boot=50)
    target = profiled_shapes(profile)["w1"]
    by = fitted_draft_costs(profile, "w1", specs,
                            lambda s: predict_draft_cost_ratio(fit, s, target)).set_index("draft")
    assert by.loc["w2", "c_measured_by"] == "profile"
    assert by.loc["cut6-distilled", "c_measured"] == by.loc["w2", "c_measured"]
    assert by.loc["cut6-distilled", "c_measured_by"] == "profile of w2"
    assert np.isnan(by.loc["cut12-distilled", "c_measured"]) and pd.isna(by.loc["cut12-distilled", "c_measured_by"])
    assert np.isnan(by.loc["hybrid-fp32", "c_measured"])  # w0's shape is profiled, but its blocks are not a forward


def write_machine_dir(directory, fit, drafts: pd.DataFrame, profile: pd.DataFrame):
    """What machine_fit leaves in results/machines/{machine}/{kernel}/."""
    directory.mkdir(parents=True)
    fit.terms.to_csv(directory / "costmodel_terms.csv", index=False)
    fit.verify.to_csv(directory / "verify_cost.csv", index=False)
    pd.DataFrame([{"model": n, "n_layers": s.n_layers, "hidden_size": s.hidden, "intermediate_size": s.intermediate,
                   "vocab_size": s.vocab, "dtype_bytes": s.dtype_bytes, "kv_dim": s.kv_dim}
                  for n, s in profiled_shapes(profile).items()]).to_csv(directory / "shapes.csv", index=False)
    drafts.to_csv(directory / "fitted_drafts_c.csv", index=False)


def test_machine_fit_load_prefers_decode_measured_c_and_fills_in_from_the_fit(two_machines, tmp_path):
    fit, drafts = two_machines["bandwidth"]
    directory = tmp_path / "machine-a" / "auto"
    write_machine_dir(directory, fit, drafts, machine_profile(BANDWIDTH_BOUND, 0))
    # A decode run measured the bf16 draft and w0 (an older table: no c_measured_by column).
    decoded = drafts[drafts["draft"].isin(["w0-bf16", "w0"])].drop(columns="c_measured_by").assign(c_measured=0.123)
    decoded.to_csv(directory / "drafts_c.csv", index=False)
    loaded = MachineFit.load(directory, "w1")
    assert (loaded.machine, loaded.kernel, loaded.target) == ("machine-a", "auto", WIDTHS[1])
    by = loaded.drafts.set_index("draft")
    assert by.loc["w0-bf16", "c_measured"] == 0.123 and by.loc["w0-bf16", "c_measured_by"] == "decode"
    assert by.loc["w0", "c_measured"] == 0.123 and by.loc["w0", "c_measured_by"] == "decode"
    assert by.loc["self-4", "c_measured_by"] == "profile"  # only the fit's table has it
    assert by.loc["w0-cut6", "c_predicted"] == pytest.approx(drafts.set_index("draft").loc["w0-cut6", "c_predicted"])
    assert len(by) == len(drafts)


def test_verdict_across_machines_places_each_by_its_overhead_share(two_machines, tmp_path):
    fits = []
    for name, (fit, drafts) in two_machines.items():
        machine = BANDWIDTH_BOUND if name == "bandwidth" else OVERHEAD_BOUND
        write_machine_dir(tmp_path / name / "auto", fit, drafts, machine_profile(machine, 0))
        fits.append(MachineFit.load(tmp_path / name / "auto", "w1"))
    reported = {"seed": {"target_step_ms": 50.0, "draft_step_ms": 20.0, "depth_ratio": 0.857, "param_ratio": 0.32}}
    machines, drafts = machines_tables(fits, reported)
    assert list(machines.columns) == MACHINE_COLUMNS and list(drafts.columns) == DRAFT_COLUMNS
    by = machines.set_index("machine")
    assert by.loc["bandwidth", "regime"] == "bytes" and by.loc["overhead", "regime"] == "depth"
    assert by.loc["overhead", "overhead_over_layer_bytes"] > 1 > by.loc["bandwidth", "overhead_over_layer_bytes"]
    assert by.loc["overhead", "per_layer_overhead_ms"] == pytest.approx(OVERHEAD_BOUND["a"] * 1e3, rel=0.05)
    assert by.loc["bandwidth", "bandwidth_eff_gb_s"] == pytest.approx(30, rel=0.05)
    # The reported machine: s solved from c = 0.4 between the bytes (0.32) and depth (0.857) ratios.
    assert by.loc["seed", "overhead_share"] == pytest.approx((0.4 - 0.32) / (0.857 - 0.32))
    # c = s x depth + (1 - s) x bytes tracks the fit's c for the full-width draft on both machines.
    w0 = drafts[drafts["draft"] == "w0"].set_index("machine")
    for name in two_machines:
        assert w0.loc[name, "c_from_share"] == pytest.approx(w0.loc[name, "c_predicted"], rel=0.15), name
    assert "lookup" not in set(drafts["draft"])  # no layers: no depth or bytes to place
    text = verdict_text(machines, drafts, reported)
    assert "the depth regime" in text and "the bytes regime" in text


def test_the_best_draft_flips_between_machines(two_machines):
    """A deep full-width draft with more tokens per pass wins where bytes set c; a 4-layer early exit with fewer
    wins where per-layer overhead does, from the same (machine-independent) cells."""
    cells = pd.DataFrame([dict(draft="w0", domain="code", k=4, tokens_per_pass=3.2, draft_layers=24, n_prompts=5,
                               speedup_median=1.3),
                          dict(draft="self-4", domain="code", k=4, tokens_per_pass=2.2, draft_layers=4, n_prompts=5,
                               speedup_median=0.9)])
    predictions, fits = [], {}
    for name, (fit, drafts) in two_machines.items():
        fits[name] = MachineFit(name, "auto", fit.terms, None, WIDTHS[1], drafts)
        predictions.append(predicted_cells(fits[name], fit.verify, "w3", cells))
    # verify costs of the largest profiled model (w3) stand in for the target's: any measured T(m)/T(1) will do
    table = best_drafts_by_machine(pd.concat(predictions, ignore_index=True), {("bandwidth", "auto"): cells})
    best = table.set_index("machine")
    assert best.loc["bandwidth", "predicted_draft"] == "w0" and best.loc["overhead", "predicted_draft"] == "self-4"
    assert best.loc["bandwidth", "measured_draft"] == "w0" and best.loc["bandwidth", "measured_speedup"] == 1.3
    assert pd.isna(best.loc["overhead", "measured_draft"])  # it ran no cell


def test_a_measured_c_moves_between_machines_by_their_fits(two_machines):
    """A hybrid's c is the share of blocks that run its model times the model's c: the measured c of a cell is
    carried to another machine by the ratio of the two machines' fitted c for the draft."""
    fit, drafts = two_machines["overhead"]
    fitted = drafts.set_index("draft").loc["hybrid", "c_predicted"]
    cells = pd.DataFrame([dict(draft="hybrid", domain="code", k=4, tokens_per_pass=3.0, draft_layers=24, n_prompts=5,
                               c_measured=0.05, c_predicted=0.2),
                          dict(draft="w0", domain="code", k=4, tokens_per_pass=3.0, draft_layers=24, n_prompts=5,
                               c_measured=float("nan"), c_predicted=0.3)])
    predicted = predicted_cells(MachineFit("overhead", "auto", fit.terms, None, WIDTHS[1], drafts), fit.verify, "w3",
                                cells).set_index("draft")
    assert predicted.loc["hybrid", "c"] == pytest.approx(0.05 * fitted / 0.2)
    assert predicted.loc["w0", "c"] == pytest.approx(drafts.set_index("draft").loc["w0", "c_predicted"])
