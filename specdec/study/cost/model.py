"""A cost model of speculative decoding on one machine, fitted from measurements.

Step time of one batch-1 forward over m new positions (a one-token step is m = 1, a verify pass m = k + 1):

    T(m) = fixed(m) + n_layers * (a(m) + b(m) * layer_bytes) + c(m) + d(m) * head_bytes

a is the per-layer overhead (Python, kernel launches, small ops: it scales with *depth*), b = 1 / bandwidth_eff(m)
the seconds per weight byte a layer streams (it scales with *parameters*), c + d * vocab * hidden * dtype_bytes the
LM head, and fixed(m) what is left of the whole forward (embedding, final norm, rotary, mask, glue). The terms are
fitted per m from `specdec.profiling.profile_model` tables of models of different widths, by least squares over
(layer bytes, layer seconds) points, with percentile intervals from a bootstrap that resamples each model's repeats.

The seed claimed that on a CPU at batch size 1 the draft/target *depth* ratio sets the draft cost ratio c;
`depth_vs_parameters_verdict` answers that for a machine from the fitted shares of a step. The second half of this
module audits the decode stage's per-pass timings (steps.parquet) and compares predicted with measured speedups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from specdec.study.report.analysis import speedup_pairs

TERMS = ["fixed", "layer_overhead", "layer_seconds_per_byte", "head_overhead", "head_seconds_per_byte"]
SHAPE_COLUMNS = ["n_layers", "hidden_size", "intermediate_size", "vocab_size", "dtype_bytes"]


# --- model shapes ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """What a Qwen2-style step has to read: n_layers decoder layers and a vocab x hidden LM head."""

    n_layers: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: float = 4  # bytes per weight; a GGUF model's: its layers' mean (its types are mixed)
    kv_dim: int | None = None  # num_key_value_heads * head_dim; None: = hidden (no grouped-query attention)
    head_dtype_bytes: float | None = None  # the LM head's bytes per weight where it differs (a GGUF model's)

    @classmethod
    def from_row(cls, row) -> "ModelShape":
        """From a profile or shapes.csv row (profile columns: n_layers, hidden_size, ...; an fp32 table has no
        head_dtype_bytes)."""
        head = getattr(row, "head_dtype_bytes", None)
        return cls(int(row.n_layers), int(row.hidden_size), int(row.intermediate_size), int(row.vocab_size),
                   _bytes_per_weight(row.dtype_bytes), int(row.kv_dim),
                   None if head is None or pd.isna(head) else float(head))

    @classmethod
    def from_config(cls, config, dtype_bytes: int = 4) -> "ModelShape":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size,
                   dtype_bytes, config.num_key_value_heads * head_dim)

    @property
    def layer_params(self) -> int:
        h, i, kv = self.hidden, self.intermediate, self.kv_dim or self.hidden
        attention = (h * h + h) + 2 * (h * kv + kv) + h * h  # q, k, v carry biases in Qwen2; o does not
        return attention + 3 * h * i + 2 * h  # gate, up, down; two RMSNorm weights

    @property
    def layer_bytes(self) -> int:
        return self.layer_params * self.dtype_bytes

    @property
    def head_bytes(self) -> float:
        return self.vocab * self.hidden * (self.dtype_bytes if self.head_dtype_bytes is None else self.head_dtype_bytes)

    @property
    def step_bytes(self) -> int:
        """Weight bytes one step streams (the embedding lookup reads m rows only, so it is left out)."""
        return self.n_layers * self.layer_bytes + self.head_bytes


def profiled_shapes(profiles: pd.DataFrame) -> dict[str, ModelShape]:
    """The shape of every model in profile tables (profiling.profile_model), by model name."""
    first = profiles.groupby("model").first()
    return {name: ModelShape.from_row(r) for name, r in zip(first.index, first.itertuples(index=False))}


def _bytes_per_weight(value) -> float:
    """An fp32/bf16 table's whole bytes stay an int (4, 2); a GGUF model's mean is a fraction."""
    value = float(value)
    return int(value) if value.is_integer() else value


# The seed's pair (and this project's Coder variants: same shapes). Untied LM heads as loaded here.
QWEN25_1_5B = ModelShape(28, 1536, 8960, 151936, 4, kv_dim=2 * 128)
QWEN25_0_5B = ModelShape(24, 896, 4864, 151936, 4, kv_dim=2 * 64)


# --- the fit -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    estimate: float
    lo: float
    hi: float


@dataclass
class CostModelFit:
    terms: pd.DataFrame  # m, term, estimate, lo, hi (seconds; *_seconds_per_byte in s/byte)
    verify: pd.DataFrame  # model, m, estimate, lo, hi: measured whole-forward T(m) / T(1)
    models: pd.DataFrame  # the profiled models: model, shape columns, layer_bytes, head_bytes
    typical_layer_bytes: float  # median layer bytes of the profiled models
    overhead_share: Term  # a / (a + b * typical_layer_bytes) at the smallest m: the depth-scaling share of a layer
    dominant: str  # 'per-layer overhead' or 'bytes'
    draws: dict[int, np.ndarray] = field(repr=False)  # m -> (n_boot, 5) bootstrap draws in TERMS order
    confidence: float = 0.95

    @property
    def positions(self) -> list[int]:
        return sorted(self.draws)

    def params(self, m: int = 1) -> np.ndarray:
        """The five point estimates at m, in TERMS order."""
        rows = self.terms[self.terms["m"] == m].set_index("term")
        if rows.empty:
            raise KeyError(f"m={m} was not profiled (profiled: {self.positions})")
        return rows.loc[TERMS, "estimate"].to_numpy()

    def term(self, name: str, m: int = 1) -> Term:
        row = self.terms[(self.terms["m"] == m) & (self.terms["term"] == name)]
        if row.empty:
            raise KeyError(f"no term {name!r} at m={m}")
        return Term(*row.iloc[0][["estimate", "lo", "hi"]].astype(float))

    def bandwidth_eff(self, m: int = 1) -> float:
        """Effective bytes/s of a layer's weights at m positions (1 / b(m))."""
        return 1.0 / self.term("layer_seconds_per_byte", m).estimate


def _model_key(profiles: pd.DataFrame) -> pd.Series:
    if "model" in profiles:
        return profiles["model"].astype(str)
    return profiles[SHAPE_COLUMNS].astype(str).agg("-".join, axis=1)


def _weighted_line(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares intercept and slope of y on x for each row of weights (B, P): the closed form, vectorised
    over bootstrap draws. x is centred first so that bytes (~1e8) squared do not swamp the arithmetic."""
    x0 = x.mean()
    xc = x - x0
    total = weights.sum(axis=1)
    mx, my = weights @ xc / total, weights @ y / total
    sxx = weights @ (xc * xc) / total - mx * mx
    sxy = weights @ (xc * y) / total - mx * my
    slope = sxy / sxx
    return my - slope * (mx + x0), slope


def _repeat_weights(groups: pd.DataFrame, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(1 + n_boot, G) multiplicities of the (model, repeat) groups: row 0 all ones (the estimate), then bootstrap
    resamples of each model's repeats, drawn per model so that every resample still holds every model."""
    weights = np.ones((1 + n_boot, len(groups)))
    for _, index in groups.groupby("model").indices.items():
        weights[1:, index] = rng.multinomial(len(index), np.full(len(index), 1 / len(index)), size=n_boot)
    return weights


def _profile_points(profiles: pd.DataFrame):
    """Per (model, repeat, m): the layer points (median seconds of the layers of one size in one forward: robust
    to a hiccup in one layer), the LM head point, the whole forward and the rest of it (fixed)."""
    df = profiles.assign(model=_model_key(profiles))
    keys = ["model", "repeat", "m"]
    layers = (df[df["component"] == "layer"].groupby(keys + ["param_bytes"], as_index=False)["seconds"].median())
    layer_sum = (df[df["component"] == "layer"].groupby(keys)["seconds"].sum())
    head = df[df["component"] == "lm_head"].set_index(keys)[["param_bytes", "seconds"]]
    forward = df[df["component"] == "forward"].set_index(keys)["seconds"]
    if forward.index.duplicated().any():
        raise ValueError("duplicate (model, repeat, m) forwards: give each profiled model its own name")
    per = pd.DataFrame({"head_bytes": head["param_bytes"], "head_seconds": head["seconds"], "forward": forward})
    per["fixed"] = per["forward"] - layer_sum - per["head_seconds"]
    if per.isna().any().any():
        raise ValueError("every (model, repeat, m) needs 'layer', 'lm_head' and 'forward' rows")
    return layers, per.reset_index()


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.nanpercentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def fit_cost_model(profiles: pd.DataFrame, n_boot: int = 1000, confidence: float = 0.95,
                   seed: int = 0) -> CostModelFit:
    """Fit the step-time terms per m from profile tables of at least two models of different widths.

    profiles: `profile_model` rows (several models concatenated; a 'model' column, else the shape, tells them
    apart). Layer and LM-head terms are straight lines in bytes; fixed(m) is the mean of forward - layers - head.
    """
    layers, per = _profile_points(profiles)
    if layers["param_bytes"].nunique() < 2 or per["head_bytes"].nunique() < 2:
        raise ValueError("the fit needs models of at least two different widths (layer and head sizes)")
    if 1 not in set(per["m"]):
        raise ValueError("the profile needs m = 1 (the one-token step every ratio refers to)")
    groups = per[["model", "repeat"]].drop_duplicates().reset_index(drop=True)
    group_of = {key: i for i, key in enumerate(zip(groups["model"], groups["repeat"]))}
    weights = _repeat_weights(groups, n_boot, np.random.default_rng(seed))

    def columns(frame):  # the weight column of each point's (model, repeat) group
        return weights[:, [group_of[key] for key in zip(frame["model"], frame["repeat"])]]

    draws, rows = {}, []
    for m in sorted(per["m"].unique()):
        lp, pp = layers[layers["m"] == m], per[per["m"] == m]
        a, b = _weighted_line(lp["param_bytes"].to_numpy(float), lp["seconds"].to_numpy(float), columns(lp))
        c, d = _weighted_line(pp["head_bytes"].to_numpy(float), pp["head_seconds"].to_numpy(float), columns(pp))
        w = columns(pp)
        fixed = w @ pp["fixed"].to_numpy(float) / w.sum(axis=1)
        all_draws = np.column_stack([fixed, a, b, c, d])
        draws[int(m)] = all_draws[1:]
        for name, column in zip(TERMS, all_draws.T):
            rows.append({"m": int(m), "term": name, "estimate": float(column[0]),
                         **dict(zip(["lo", "hi"], _interval(column[1:], confidence)))})
    terms = pd.DataFrame(rows)

    verify = _verify_ratios(per, weights, group_of, confidence)
    models = _profiled_models(profiles)
    typical = float(models["layer_bytes"].median())
    m0 = min(draws)
    share_draws = draws[m0][:, 1] / (draws[m0][:, 1] + draws[m0][:, 2] * typical)
    a0, b0 = terms.query("m == @m0").set_index("term").loc[["layer_overhead", "layer_seconds_per_byte"], "estimate"]
    share = Term(a0 / (a0 + b0 * typical), *_interval(share_draws, confidence))
    return CostModelFit(terms, verify, models, typical, share,
                        "per-layer overhead" if share.estimate > 0.5 else "bytes", draws, confidence)


def _verify_ratios(per: pd.DataFrame, weights: np.ndarray, group_of: dict, confidence: float) -> pd.DataFrame:
    """Measured T(m) / T(1) per model: ratio of mean whole-forward times, same bootstrap resamples."""
    rows = []
    for model, frame in per.groupby("model"):
        wide = frame.pivot(index="repeat", columns="m", values="forward")
        w = weights[:, [group_of[(model, r)] for r in wide.index]]
        means = (w @ wide.to_numpy(float)) / w.sum(axis=1, keepdims=True)
        ratios = means / means[:, [list(wide.columns).index(1)]]
        for j, m in enumerate(wide.columns):
            rows.append({"model": model, "m": int(m), "estimate": float(ratios[0, j]),
                         **dict(zip(["lo", "hi"], _interval(ratios[1:, j], confidence)))})
    return pd.DataFrame(rows)


def _profiled_models(profiles: pd.DataFrame) -> pd.DataFrame:
    df = profiles.assign(model=_model_key(profiles))
    layer_bytes = df[df["component"] == "layer"].groupby("model")["param_bytes"].median()
    head_bytes = df[df["component"] == "lm_head"].groupby("model")["param_bytes"].first()
    shapes = df.groupby("model")[[c for c in SHAPE_COLUMNS if c in df]].first()
    return shapes.assign(layer_bytes=layer_bytes, head_bytes=head_bytes).reset_index()


def verify_cost(fit: CostModelFit, m: int, model: str | None = None) -> Term:
    """Measured T(m) / T(1) of a profiled model (default: the one with the most bytes per step, the target)."""
    if model is None:
        sizes = fit.models.assign(step=fit.models["n_layers"] * fit.models["layer_bytes"] + fit.models["head_bytes"])
        model = sizes.sort_values("step").iloc[-1]["model"]
    row = fit.verify[(fit.verify["model"] == model) & (fit.verify["m"] == m)]
    if row.empty:
        raise KeyError(f"no measured verify cost for model {model!r} at m={m}")
    return Term(*row.iloc[0][["estimate", "lo", "hi"]].astype(float))


def _step_parts(params: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
    """The step split by what it scales with; params (..., 5) in TERMS order (estimates or bootstrap draws)."""
    fixed, a, b, c, d = np.moveaxis(np.asarray(params, dtype=float), -1, 0)
    return {"fixed": fixed + c,  # the head's own overhead does not grow with depth or width either
            "depth": shape.n_layers * a,
            "bytes": shape.n_layers * b * shape.layer_bytes + d * shape.head_bytes}


def _step_time(params: np.ndarray, shape: ModelShape) -> np.ndarray:
    return sum(_step_parts(params, shape).values())


def predict_step_time(fit: CostModelFit, n_layers: int, hidden: int, intermediate: int, vocab: int,
                      dtype_bytes: int = 4, m: int = 1, kv_dim: int | None = None) -> float:
    """Predicted seconds of one forward over m positions for a Qwen2-style shape (m must have been profiled)."""
    shape = ModelShape(n_layers, hidden, intermediate, vocab, dtype_bytes, kv_dim)
    return float(_step_time(fit.params(m), shape))


def predict_draft_cost_ratio(fit: CostModelFit, draft_shape: ModelShape, target_shape: ModelShape,
                             m: int = 1) -> float:
    """c = draft step / target step, both at m positions (one-token steps by default)."""
    params = fit.params(m)
    return float(_step_time(params, draft_shape) / _step_time(params, target_shape))


def _closer(c: float, depth_ratio: float, parameter_ratio: float) -> str:
    # Compared on a log scale: a cost ratio is off by a factor, not by a difference.
    return "depth" if abs(math.log(c / depth_ratio)) < abs(math.log(c / parameter_ratio)) else "parameters"


@dataclass
class Verdict:
    regime: str  # 'depth' or 'parameters': which part of the target's step is larger
    table: pd.DataFrame
    text: str


def depth_vs_parameters_verdict(fit: CostModelFit, target_shape: ModelShape,
                                draft_shapes: Mapping[str, ModelShape] | Sequence[ModelShape],
                                m: int = 1) -> Verdict:
    """Which share of a step scales with depth (n_layers * per-layer overhead) and which with parameters (weight
    bytes / effective bandwidth), for the target and each draft; each draft's predicted c with its interval next
    to the depth ratio and the parameter (step-bytes) ratio it would equal in either pure regime."""
    if not isinstance(draft_shapes, Mapping):
        draft_shapes = {f"draft{i}": shape for i, shape in enumerate(draft_shapes)}
    params, draws = fit.params(m), fit.draws[m]
    target_time, target_draws = _step_time(params, target_shape), _step_time(draws, target_shape)
    rows = []
    for name, shape in {"target": target_shape, **draft_shapes}.items():
        parts = _step_parts(params, shape)
        total = sum(parts.values())
        c_draws = _step_time(draws, shape) / target_draws
        depth_ratio = shape.n_layers / target_shape.n_layers
        parameter_ratio = shape.step_bytes / target_shape.step_bytes
        c = float(total / target_time)
        c_lo, c_hi = _interval(c_draws, fit.confidence)
        rows.append({
            "model": name, "n_layers": shape.n_layers, "step_bytes": shape.step_bytes, "step_seconds": float(total),
            **{f"{part}_share": float(value / total) for part, value in parts.items()},
            "c": c, "c_lo": c_lo, "c_hi": c_hi,
            "depth_ratio": depth_ratio, "parameter_ratio": parameter_ratio,
            "c_closer_to": _closer(c, depth_ratio, parameter_ratio) if name != "target" else None,
        })
    table = pd.DataFrame(rows)
    target = table.iloc[0]
    regime = "depth" if target["depth_share"] > target["bytes_share"] else "parameters"
    lines = [f"target step at m={m}: {target['step_seconds'] * 1e3:.1f} ms = {target['depth_share']:.0%} per-layer "
             f"overhead (scales with depth) + {target['bytes_share']:.0%} weight bytes (scales with parameters) + "
             f"{target['fixed_share']:.0%} fixed; effective bandwidth {fit.bandwidth_eff(m) / 1e9:.1f} GB/s, "
             f"per-layer overhead {fit.params(m)[1] * 1e3:.3f} ms."]
    for row in table.iloc[1:].itertuples():
        lines.append(f"{row.model}: predicted c = {row.c:.3f} [{row.c_lo:.3f}, {row.c_hi:.3f}]; depth ratio "
                     f"{row.depth_ratio:.3f}, parameter ratio {row.parameter_ratio:.3f}: closer to the "
                     f"{'depth' if row.c_closer_to == 'depth' else 'parameter'} ratio.")
    lines.append(f"verdict: the {'depth' if regime == 'depth' else 'parameter'} ratio sets the cost of a step on "
                 f"this machine ({'per-layer overhead dominates' if regime == 'depth' else 'weight bytes dominate'} "
                 "the target's step).")
    return Verdict(regime, table, "\n".join(lines))


# --- speedup from acceptance --------------------------------------------------------------------------------------
def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Tokens emitted per verify pass when each draft token is accepted independently with probability alpha:
    1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha); k + 1 at alpha = 1."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_catchup_rate(alpha: float, k: int) -> float:
    """Share of blocks that begin with a catch-up call: the previous block kept all k tokens (alpha^k)."""
    return alpha ** k


def predicted_speedup(tokens_per_pass: float, t_target_1: float, t_draft_step: float, t_verify_k1: float,
                      t_catchup: float, catchup_rate: float, *, k: int) -> float:
    """Baseline seconds per token / speculative seconds per token, for blocks of k drafted tokens.

    - tokens_per_pass * t_target_1: what the baseline spends on the tokens one block emits (one step per token);
    - k * t_draft_step: the block's k one-token draft calls;
    - t_verify_k1: the target's forward over k + 1 positions (not one step: see verify_cost);
    - catchup_rate * (t_catchup - t_draft_step): after a fully accepted block the first draft call also carries the
      last draft token and the bonus token; that call replaces one one-token call, so only its extra cost is charged.
    The accept test and sampling (decide_seconds) are left out: both methods pay them per emitted token.
    """
    catchup = catchup_rate * (t_catchup - t_draft_step) if catchup_rate > 0 else 0.0
    return tokens_per_pass * t_target_1 / (k * t_draft_step + t_verify_k1 + catchup)


# --- the decode stage's audited timings ---------------------------------------------------------------------------
AUDIT_KEYS = ("draft", "domain", "k")
AUDIT_COLUMNS = ["n_blocks", "draft_step_seconds", "catchup_call_seconds", "catchup_tokens_mean", "catchup_rate",
                 "verify_seconds", "target_step_seconds", "c", "verify_cost_ratio", "decode_tokens_per_pass",
                 "prefill_target_seconds", "prefill_draft_seconds", "draft_seconds_per_block",
                 "catchup_seconds_per_block"]


def one_token_calls(blocks: pd.DataFrame) -> pd.Series:
    """A block with drafted = d makes d draft calls; the first one is the catch-up call when catchup_tokens > 0."""
    return blocks["drafted"] - (blocks["catchup_tokens"] > 0).astype(int)


def audited_step_timings(steps: pd.DataFrame, keys: Sequence[str] = AUDIT_KEYS) -> pd.DataFrame:
    """The seed's audited step timings per (draft, domain, k), from steps.parquet rows (medians over passes).

    draft_step_seconds: median over blocks of draft_seconds / one-token calls; catchup_call_seconds and
    catchup_tokens_mean: the catch-up calls; catchup_rate: share of blocks that had one; verify_seconds: median
    verify pass over k + 1 positions; target_step_seconds: median baseline one-token step; c = draft step / target
    step; verify_cost_ratio = verify / target step; decode_tokens_per_pass: emitted per speculative pass after the
    prefill; prefill_*: median prompt passes of the target (both methods) and of the draft; draft_seconds_per_block
    and catchup_seconds_per_block: means over blocks (a hybrid draft's blocks mix free lookups with model calls, so
    the median call is 0 while the mean is what the blocks cost).
    """
    keys = list(keys)
    spec = steps[steps["method"] == "speculative"]
    blocks = spec[spec["kind"] == "block"]
    calls = one_token_calls(blocks)
    blocks = blocks.assign(per_call=(blocks["draft_seconds"] / calls).where(calls > 0),
                           has_catchup=blocks["catchup_tokens"] > 0,
                           full_verify=blocks["positions"] == blocks["k"] + 1)
    catchups, full = blocks[blocks["has_catchup"]], blocks[blocks["full_verify"]]
    baseline_steps = steps[(steps["method"] == "baseline") & (steps["kind"] == "target")]
    prefill = steps[steps["kind"] == "prefill"]
    audit = pd.concat([
        blocks.groupby(keys).agg(n_blocks=("drafted", "size"), draft_step_seconds=("per_call", "median"),
                                 catchup_rate=("has_catchup", "mean"),
                                 draft_seconds_per_block=("draft_seconds", "mean"),
                                 catchup_seconds_per_block=("catchup_seconds", "mean")),
        catchups.groupby(keys).agg(catchup_call_seconds=("catchup_seconds", "median"),
                                   catchup_tokens_mean=("catchup_tokens", "mean")),
        full.groupby(keys)["verify_seconds"].median().rename("verify_seconds"),
        baseline_steps.groupby(keys)["verify_seconds"].median().rename("target_step_seconds"),
        spec[spec["kind"] != "prefill"].groupby(keys)["emitted"].mean().rename("decode_tokens_per_pass"),
        prefill.groupby(keys)["verify_seconds"].median().rename("prefill_target_seconds"),
        prefill[prefill["method"] == "speculative"].groupby(keys)["draft_seconds"].median()
        .rename("prefill_draft_seconds"),
    ], axis=1)
    audit = audit[audit["n_blocks"].notna()]  # groups with speculative blocks only
    audit["c"] = audit["draft_step_seconds"] / audit["target_step_seconds"]
    audit["verify_cost_ratio"] = audit["verify_seconds"] / audit["target_step_seconds"]
    audit["n_blocks"] = audit["n_blocks"].astype(int)
    return audit.reset_index()[keys + AUDIT_COLUMNS]


def pooled_rates(sequences: pd.DataFrame, keys: Sequence[str] = AUDIT_KEYS) -> pd.DataFrame:
    """Per group: acceptance and tokens per pass pooled over the speculative sequences (as in the study table),
    mean sequence length, prompts, and the measured median speedup over prompts x repeats."""
    keys = list(keys)
    spec = sequences[sequences["method"] == "speculative"]
    pooled = spec.groupby(keys).agg(accepted=("accepted", "sum"), drafted=("drafted", "sum"),
                                    tokens=("n_tokens", "sum"), passes=("target_passes", "sum"),
                                    n_tokens=("n_tokens", "mean"), n_prompts=("prompt_id", "nunique")).reset_index()
    pooled["acceptance"] = pooled["accepted"] / pooled["drafted"]
    pooled["tokens_per_pass"] = pooled["tokens"] / pooled["passes"]
    measured = speedup_pairs(sequences).groupby(keys)["speedup"].median().rename("measured_speedup").reset_index()
    return pooled.merge(measured, on=keys)
