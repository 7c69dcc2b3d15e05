"""The speedup the profiled step costs predict from measured acceptance, next to the measured speedup.

Costs come from the profiling stage (`specdec.profiling.profile_model` tables: whole-forward seconds of each model
at m new positions); acceptance, tokens per pass and the catch-up rate from the decode stage's steps. A draft that is
a model of its own is profiled itself; an early-exit draft costs the target's forward minus the layers it skips; a
draft without a profiled forward (prompt lookup, a hybrid, a model in another dtype) is priced at what its blocks
measured: the mean drafting and catch-up seconds per block. Prompt passes are not profiled (their
length varies): the prediction charges the measured ones, because the measured totals include them.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from specdec.drafts import get_kind
from specdec.study.cost.model import AUDIT_KEYS, audited_step_timings, pooled_rates, predicted_speedup, profiled_shapes

COSTMODEL_COLUMNS = ["draft", "domain", "k", "acceptance", "tokens_per_pass", "c", "verify_cost_ratio",
                     "predicted_speedup", "measured_speedup", "rel_error"]
EXTRA_COLUMNS = ["measured_decode_speedup", "c_measured", "verify_cost_ratio_measured", "predicted_speedup_pooled",
                 "predicted_decode_speedup",
                 "prefill_share", "drafted_per_block", "n_prompts"]

# bytes per weight of the dtypes a draft may be given (config key draft_kinds.*.dtype): no torch in the table stages
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "q8_0": 34 / 32}  # q8_0: 32 int8 and an fp16 scale


def forward_seconds(profiles: pd.DataFrame) -> pd.Series:
    """Median whole-forward seconds per (model, m)."""
    forwards = profiles[profiles["component"] == "forward"]
    return forwards.groupby(["model", "m"])["seconds"].median()


def early_exit_seconds(target_profile: pd.DataFrame, layers: int) -> pd.Series:
    """Per m: the target's forward minus the decoder layers an early exit after `layers` layers skips (medians of
    per-repeat differences, so that a slow repeat is not mixed with a fast one)."""
    skipped = target_profile[(target_profile["component"] == "layer") & (target_profile["layer"] >= layers)]
    skipped = skipped.groupby(["m", "repeat"])["seconds"].sum()
    whole = target_profile[target_profile["component"] == "forward"].set_index(["m", "repeat"])["seconds"]
    return (whole - skipped).groupby("m").median()


def draft_costs(profiles: pd.DataFrame, target: str, draft_specs: dict[str, dict],
                profiled_dtype: str = "float32") -> dict[str, pd.Series | None]:
    """Per draft, seconds of a draft forward by m, from what its kind says a step runs (DraftCost); None where the
    measured proposal time prices it instead: no model, a mix of model and no model, or a model held in a dtype
    other than the profiled one."""
    forward = forward_seconds(profiles)
    costs: dict[str, pd.Series | None] = {}
    for name, spec in draft_specs.items():
        cost = get_kind(spec["kind"]).cost(name, spec)
        if cost.measured or (cost.dtype or profiled_dtype) != profiled_dtype:
            costs[name] = None
        elif cost.model:
            costs[name] = forward.loc[cost.model]
        elif cost.target_layers:
            costs[name] = early_exit_seconds(profiles[profiles["model"] == target], cost.target_layers)
        else:
            costs[name] = None
    return costs


def profiled_costmodel_table(profiles: pd.DataFrame, steps: pd.DataFrame, sequences: pd.DataFrame, target: str,
                             draft_specs: dict[str, dict], setting: str = "greedy",
                             profiled_dtype: str = "float32") -> pd.DataFrame:
    """One row per (draft, domain, k): measured acceptance and tokens per pass; c = T_draft(1) / T_target(1) and
    verify_cost_ratio = T_target(k + 1) / T_target(1) from the profiles.

    predicted_speedup prices each sequence as it ran: its measured prompt passes, then n - 1 tokens in blocks at the
    profiled costs of what each block did (the draft calls it made, a verify pass over its positions, the catch-up
    call). It is the median over prompts x repeats of the per-sequence predictions, as measured_speedup is the median
    of the per-sequence measured ratios: acceptance varies a lot between prompts, and the speedup is not linear in it,
    so a prediction from pooled rates (predicted_speedup_pooled) is biased where the spread is wide.
    predicted_decode_speedup is the issue's closed form (k draft steps, one verify over k + 1 positions) at the pooled
    rates. rel_error = predicted / measured - 1."""
    steps, sequences = steps[steps["setting"] == setting], sequences[sequences["setting"] == setting]
    keys = list(AUDIT_KEYS)
    target_forward = forward_seconds(profiles).loc[target]
    costs = draft_costs(profiles, target, draft_specs, profiled_dtype)
    cells = _profiled_predictions(steps, sequences, keys, target_forward, costs)
    per_sequence = _profiled_predictions(steps, sequences, keys + ["prompt_id", "repeat"], target_forward, costs,
                                         (cells["draft_seconds_per_block"] / cells["drafted_per_block"])
                                         .set_axis(pd.MultiIndex.from_frame(cells[keys])))
    table = cells.rename(columns={"predicted_speedup": "predicted_speedup_pooled"})
    table = table.merge(per_sequence.groupby(keys)["predicted_speedup"].median().reset_index(), on=keys)
    table = table.merge(decode_phase_speedups(steps).groupby(keys)["decode_speedup"].median()
                        .rename("measured_decode_speedup").reset_index(), on=keys, how="left")
    table["rel_error"] = table["predicted_speedup"] / table["measured_speedup"] - 1
    return table[COSTMODEL_COLUMNS + EXTRA_COLUMNS].sort_values(keys).reset_index(drop=True)


def decode_phase_speedups(steps: pd.DataFrame) -> pd.DataFrame:
    """Per sequence pair (job, prompt, repeat): the speedup of the decoding phase alone, after the prompt pass that
    both methods pay (and the draft's own prompt pass): baseline seconds of its one-token steps over the speculative
    seconds of its blocks and plain steps (draft, catch-up, verify and decide time)."""
    keys = [*AUDIT_KEYS, "prompt_id", "repeat"]
    decoding = steps[steps["kind"] != "prefill"]
    seconds = (decoding["draft_seconds"] + decoding["catchup_seconds"] + decoding["verify_seconds"]
               + decoding["decide_seconds"])
    per_method = decoding.assign(seconds=seconds).pivot_table(index=keys, columns="method", values="seconds",
                                                              aggfunc="sum")
    return (per_method["baseline"] / per_method["speculative"]).rename("decode_speedup").reset_index()


def _profiled_predictions(steps: pd.DataFrame, sequences: pd.DataFrame, keys: list[str], target_forward: pd.Series,
                          costs: dict, cell_proposal_seconds: pd.Series | None = None) -> pd.DataFrame:
    """Per group of `keys`: the audited timings, pooled rates and the speedup the profiled costs predict.
    cell_proposal_seconds: per (draft, domain, k), the measured proposal time per drafted token of a draft without a
    profiled forward, used when a group is a single sequence that drafted nothing."""
    audit = audited_step_timings(steps, keys)
    audit = audit.rename(columns={"c": "c_measured", "verify_cost_ratio": "verify_cost_ratio_measured"})
    table = audit.merge(pooled_rates(sequences, keys), on=keys)
    # Blocks as they ran: the draft stops at an EOS and the last blocks of a sequence draft only what the token
    # budget leaves, so a block drafts fewer than k tokens on average and its verify pass covers drafted + 1
    # positions. Each block is priced at the profiled cost of what it did.
    blocks = steps[(steps["method"] == "speculative") & (steps["kind"] == "block")]
    blocks = blocks.assign(profiled_verify=blocks["positions"].map(target_forward))
    per_block = blocks.groupby(keys).agg(drafted_per_block=("drafted", "mean"),
                                         verify_per_block=("profiled_verify", "mean"))
    table = table.merge(per_block.reset_index(), on=keys, how="left")
    rows = []
    for r in table.itertuples():
        k, t1 = int(r.k), float(target_forward.loc[1])
        draft = costs.get(r.draft)
        t_verify = float(target_forward.loc[k + 1])
        if draft is None:
            # Measured proposals (lookup, a hybrid, a bf16 model): what the blocks spent drafting and catching up, on
            # average. Per drafted token for the closed form, whose catch-up term then carries the mean catch-up.
            t_draft = r.draft_seconds_per_block / r.drafted_per_block if r.drafted_per_block else float("nan")
            if pd.isna(t_draft) and cell_proposal_seconds is not None:  # a sequence that drafted nothing
                t_draft = float(cell_proposal_seconds.loc[(r.draft, r.domain, r.k)])
            t_draft = 0.0 if pd.isna(t_draft) else t_draft
            t_catchup = t_draft + (r.catchup_seconds_per_block / r.catchup_rate if r.catchup_rate > 0 else 0.0)
            block_drafting = r.draft_seconds_per_block + r.catchup_seconds_per_block
        else:
            t_draft, t_catchup = float(draft.loc[1]), float(draft.loc[2])
            block_drafting = r.drafted_per_block * t_draft + r.catchup_rate * (t_catchup - t_draft)
        decode = predicted_speedup(r.decode_tokens_per_pass, t1, t_draft, t_verify, t_catchup, r.catchup_rate, k=k)
        # Whole sequences: both pay the target's prompt pass, speculative also the draft's; then n - 1 tokens.
        rest = r.n_tokens - 1
        baseline = r.prefill_target_seconds + rest * t1
        block = block_drafting + r.verify_per_block
        prefill_draft = 0.0 if pd.isna(r.prefill_draft_seconds) else r.prefill_draft_seconds
        speculative = r.prefill_target_seconds + prefill_draft + rest / r.decode_tokens_per_pass * block
        rows.append({
            "c": t_draft / t1, "verify_cost_ratio": t_verify / t1,
            "predicted_speedup": baseline / speculative, "predicted_decode_speedup": decode,
            "prefill_share": r.prefill_target_seconds / baseline,
        })
    return pd.concat([table.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def roofline(profiles: pd.DataFrame, bandwidth_bytes_per_second: float, target: str,
             steps: pd.DataFrame) -> pd.DataFrame:
    """Per m: the weight bytes one target forward reads / the measured read bandwidth (the floor), the profiled
    forward, and the decode stage's measured baseline step (m = 1) and verify passes (m = k + 1)."""
    profile = profiles[profiles["model"] == target]
    step_bytes = int(profile[profile["component"].isin(["layer", "lm_head"])]
                     .drop_duplicates(["component", "layer"])["param_bytes"].sum())
    floor = step_bytes / bandwidth_bytes_per_second
    profiled = forward_seconds(profiles).loc[target]
    greedy = steps[steps["setting"] == "greedy"] if "setting" in steps else steps
    baseline = greedy[(greedy["method"] == "baseline") & (greedy["kind"] == "target")]["verify_seconds"].median()
    verify = greedy[(greedy["method"] == "speculative") & (greedy["kind"] == "block")]
    verify = verify.groupby("positions")["verify_seconds"].median()
    rows = []
    for m, seconds in profiled.items():
        decoded = baseline if m == 1 else verify.get(m)
        rows.append({"m": int(m), "weight_bytes": step_bytes, "bandwidth_gb_s": bandwidth_bytes_per_second / 1e9,
                     "floor_seconds": floor, "profiled_seconds": float(seconds),
                     "profiled_over_floor": float(seconds) / floor,
                     "decode_seconds": None if decoded is None or pd.isna(decoded) else float(decoded),
                     "decode_over_floor": None if decoded is None or pd.isna(decoded) else float(decoded) / floor})
    return pd.DataFrame(rows)


DRAFTS_COLUMNS = ["draft", "kind", "draft_layers", "target_layers", "depth_ratio", "param_ratio", "c_measured",
                  "c_predicted", "domain", "k", "acceptance", "tokens_per_pass", "speedup_median"]
# After the columns: which run a cell comes from (the study grid or the draft sweep), over how many prompts,
# the speedup the profiled costs predict for it (profiled_costmodel_table) and the measured speedup of the decoding
# phase alone (after the prompt passes, decode_phase_speedups).
DRAFTS_EXTRA_COLUMNS = ["run", "n_prompts", "predicted_speedup", "decode_speedup_median"]


def draft_shapes(draft_specs: dict[str, dict], profile_shapes: dict, target: str) -> dict:
    """The ModelShape each draft runs per step (None for a draft without a model): the profiled shape of the model
    its kind names (with the bytes of the draft's own dtype where it names one), or the target's with fewer layers
    for an early exit."""
    shapes = {}
    for name, spec in draft_specs.items():
        cost = get_kind(spec["kind"]).cost(name, spec)
        base = spec.get("model")
        if cost.model and cost.model not in profile_shapes and spec.get("layers") and base in profile_shapes:
            # a cut of a profiled model (truncated, distilled) that was not profiled itself: its base, fewer layers
            shapes[name] = replace(profile_shapes[base], n_layers=int(spec["layers"]))
        elif cost.model:
            shapes[name] = profile_shapes[cost.model]
            if cost.dtype:
                shapes[name] = replace(shapes[name], dtype_bytes=DTYPE_BYTES[cost.dtype])
        elif cost.target_layers:
            shapes[name] = replace(profile_shapes[target], n_layers=cost.target_layers)
        elif cost.head_layer:
            shapes[name] = head_shape(profile_shapes[target], cost, draft_specs.get(spec.get("head")) or {})
        else:
            shapes[name] = None
    return shapes


def head_step(cost, base_spec: dict) -> tuple[int | None, str]:
    """What a feature head drafts with: (its drafting vocabulary's size, its own `vocab` or that of the head it drafts
    with; None: the whole vocabulary) and its drafting dtype (default: fp32)."""
    return cost.head_vocab or base_spec.get("vocab"), cost.dtype or base_spec.get("dtype") or "float32"


def head_profile_name(vocab: int | None, dtype: str) -> str:
    """The profile of a head's draft step of this vocabulary and dtype (the machine fit's; one for every draft that
    drafts so: the step's cost does not depend on the trained weights)."""
    return f"feature-head-v{vocab or 'all'}-{dtype}"


def head_shape(target, cost, base_spec: dict):
    """What a feature head's step reads: one layer shaped like the target's, its fc (2 hidden x hidden: counted as
    2 hidden / 3 more MLP rows, the same number of weights), and the LM head's rows of its drafting vocabulary, all
    in its dtype (head_step)."""
    vocab, dtype = head_step(cost, base_spec)
    return replace(target, n_layers=1, intermediate=target.intermediate + 2 * target.hidden // 3,
                   vocab=int(vocab or target.vocab), dtype_bytes=DTYPE_BYTES[dtype], head_dtype_bytes=None)


def drafts_table(costmodel: pd.DataFrame, draft_specs: dict[str, dict], shapes: dict, target_shape,
                 predict_c, run: str = "study") -> pd.DataFrame:
    """The depth sweep: per (draft, domain, k) the draft's depth and parameter (step bytes) ratios to the target, c
    measured in the decode runs and predicted by the cost-model fit (`predict_c(shape)`), acceptance, tokens per
    pass and the measured median speedup; `run` names where the cells come from."""
    rows = []
    for r in costmodel.itertuples():
        shape = shapes[r.draft]
        rows.append({
            "draft": r.draft, "kind": draft_specs[r.draft]["kind"],
            "draft_layers": shape.n_layers if shape else 0, "target_layers": target_shape.n_layers,
            "depth_ratio": shape.n_layers / target_shape.n_layers if shape else 0.0,
            "param_ratio": shape.step_bytes / target_shape.step_bytes if shape else 0.0,
            "c_measured": r.c_measured, "c_predicted": predict_c(shape) if shape else 0.0,
            "domain": r.domain, "k": r.k, "acceptance": r.acceptance, "tokens_per_pass": r.tokens_per_pass,
            "speedup_median": r.measured_speedup,
            "run": run, "n_prompts": r.n_prompts, "predicted_speedup": r.predicted_speedup,
            "decode_speedup_median": getattr(r, "measured_decode_speedup", float("nan")),
        })
    return pd.DataFrame(rows, columns=DRAFTS_COLUMNS + DRAFTS_EXTRA_COLUMNS)


def per_draft_costs(drafts: pd.DataFrame) -> pd.DataFrame:
    """Per draft of a drafts table: its kind, depth and bytes ratios, c measured (median and range over its cells)
    and c the fit predicts: what the cross-machine verdict (machines.py) compares."""
    return drafts.groupby(["draft", "kind"], as_index=False).agg(
        draft_layers=("draft_layers", "first"), target_layers=("target_layers", "first"),
        depth_ratio=("depth_ratio", "first"), param_ratio=("param_ratio", "first"),
        c_measured=("c_measured", "median"), c_measured_lo=("c_measured", "min"),
        c_measured_hi=("c_measured", "max"), c_predicted=("c_predicted", "first"))


FITTED_DRAFT_COLUMNS = ["draft", "kind", "draft_layers", "target_layers", "depth_ratio", "param_ratio", "c_measured",
                        "c_predicted", "c_measured_by"]


def fitted_draft_costs(profiles: pd.DataFrame, target: str, draft_specs: dict[str, dict], predict_c,
                       profiled_dtype: str = "float32") -> pd.DataFrame:
    """Per draft, without decoding: its depth and bytes ratios, c the fit predicts (`predict_c(shape)`) and, where
    the profiles hold what one of its steps runs (a model profiled in its own dtype, the target's first layers, a
    feature head's draft step of its vocabulary and dtype: head_profile_name), c measured as profiled one-token
    forwards (draft / target). A draft whose own model was not profiled but whose shapes are a profiled draft's (a
    distilled cut beside the truncated cut of the same layers: the same products over the same bytes) takes that
    draft's c, marked "profile of <draft>"; a head, "profile of <its step's profile>". A draft the profiles cannot
    price is left out."""
    shapes = profiled_shapes(profiles)
    target_shape = shapes[target]
    forward = forward_seconds(profiles)
    profiled = set(shapes)
    priceable = {name: spec for name, spec in draft_specs.items()
                 if _priceable(name, spec, profiled)}
    costs = draft_costs(profiles, target, {n: s for n, s in priceable.items() if _profiled_itself(n, s, profiled)},
                        profiled_dtype)
    draft_shape = draft_shapes(priceable, shapes, target)
    measured = {name: float(costs[name].loc[1] / forward.loc[(target, 1)])
                for name in draft_shape if costs.get(name) is not None}
    heads = {name: head_profile_name(*head_step(get_kind(spec["kind"]).cost(name, spec),
                                                draft_specs.get(spec.get("head")) or {}))
             for name, spec in priceable.items() if get_kind(spec["kind"]).cost(name, spec).head_layer}
    profiled_by_shape = {draft_shape[name]: name for name in measured if draft_shape[name] is not None}
    rows = []
    for name, shape in draft_shape.items():
        c_measured, measured_by = measured.get(name, float("nan")), "profile" if name in measured else None
        spec = priceable[name]
        one_forward = not get_kind(spec["kind"]).cost(name, spec).measured  # a hybrid's blocks are not one forward
        if measured_by is None and one_forward and shape in profiled_by_shape:
            twin = profiled_by_shape[shape]
            c_measured, measured_by = measured[twin], f"profile of {twin}"
        elif name in heads and heads[name] in profiled and not spec.get("lookup"):  # a lookup mix: its blocks
            c_measured = float(forward.loc[(heads[name], 1)] / forward.loc[(target, 1)])
            measured_by = f"profile of {heads[name]}"
        rows.append({"draft": name, "kind": spec["kind"],
                     "draft_layers": shape.n_layers if shape else 0, "target_layers": target_shape.n_layers,
                     "depth_ratio": shape.n_layers / target_shape.n_layers if shape else 0.0,
                     "param_ratio": shape.step_bytes / target_shape.step_bytes if shape else 0.0,
                     "c_measured": c_measured, "c_predicted": predict_c(shape) if shape else 0.0,
                     "c_measured_by": measured_by})
    return pd.DataFrame(rows, columns=FITTED_DRAFT_COLUMNS)


def _priceable(name: str, spec: dict, profiled: set[str]) -> bool:
    """Whether the profiles give a draft a shape: its model (or the model it is a cut of) or the target was profiled."""
    cost = get_kind(spec["kind"]).cost(name, spec)
    if cost.model:
        return cost.model in profiled or (bool(spec.get("layers")) and spec.get("model") in profiled)
    return True  # an early exit (the target is always profiled) or no model at all


def _profiled_itself(name: str, spec: dict, profiled: set[str]) -> bool:
    cost = get_kind(spec["kind"]).cost(name, spec)
    return not cost.model or cost.model in profiled


def best_per_domain(drafts: pd.DataFrame) -> pd.DataFrame:
    """The draft and k with the highest median speedup in each domain."""
    best = drafts.loc[drafts.groupby("domain")["speedup_median"].idxmax()]
    columns = ["domain", "draft", "kind", "k", "acceptance", "tokens_per_pass", "speedup_median"]
    columns += [c for c in ("run", "n_prompts") if c in drafts]
    return best[columns].reset_index(drop=True)
