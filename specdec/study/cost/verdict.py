"""The depth question as a function of the machine: one row per measured machine (and engine kernel), from its
cost-model fit, and the condition under which the draft's depth rather than its bytes sets the ceiling.

A step costs n_layers x a (per-layer overhead: scales with depth) + bytes x b (weight bytes over the effective
bandwidth: scales with parameters) + a little that scales with neither. With s the share of the target's step that
is per-layer overhead, a draft's cost ratio is, to first order,

    c = s x (depth ratio) + (1 - s) x (bytes ratio),

so s is where a machine sits between the two answers: depth sets the ceiling where s > 1/2, that is where a
layer's overhead a exceeds the time its bytes take to stream (b x layer bytes). The same relation, solved for s,
places a machine known only by its measured target and draft steps (e.g. the seed write-up's Apple M4 Pro).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specdec.study.cost.model import TERMS, ModelShape, _step_parts, predicted_speedup

MACHINE_COLUMNS = ["machine", "kernel", "source", "per_layer_overhead_ms", "per_layer_overhead_ms_lo",
                   "per_layer_overhead_ms_hi", "bandwidth_eff_gb_s", "bandwidth_eff_gb_s_lo", "bandwidth_eff_gb_s_hi",
                   "read_bandwidth_gb_s", "target_step_ms", "target_overhead_ms", "target_bytes_ms", "target_fixed_ms",
                   "overhead_share", "overhead_over_layer_bytes", "regime"]
# Per-draft c tables a machine's directory may hold, most measured first (costmodel, drafts_table, machine_fit).
DRAFT_C_FILES = ("drafts_c.csv", "sweep_drafts_c.csv", "fitted_drafts_c.csv")
DRAFT_COLUMNS = ["machine", "kernel", "source", "draft", "kind", "depth_ratio", "param_ratio", "c_measured",
                 "c_measured_by", "c_predicted", "c_from_share", "depth_part_of_c"]


def regime(overhead_share: float) -> str:
    return "depth" if overhead_share > 0.5 else "bytes"


def share_from_c(c: float, depth_ratio: float, param_ratio: float) -> float:
    """The overhead share s that makes c = s x depth + (1 - s) x bytes (a machine known only by its c)."""
    return (c - param_ratio) / (depth_ratio - param_ratio)


def _term(terms: pd.DataFrame, name: str, m: int = 1) -> tuple[float, float, float]:
    row = terms[(terms["m"] == m) & (terms["term"] == name)].iloc[0]
    return float(row["estimate"]), float(row["lo"]), float(row["hi"])


def _draft_c_table(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    if "c_measured_by" not in table:  # written before machine_fit existed: the decode runs measured it
        table["c_measured_by"] = "decode"
    table["c_measured_by"] = table["c_measured_by"].where(table["c_measured"].notna())
    return table


@dataclass
class MachineFit:
    """What results/machines/{machine}/{kernel}/ holds: the fitted terms, the measured read bandwidth, the target's
    shape and the measured and fitted c of the drafts studied there."""

    machine: str
    kernel: str
    terms: pd.DataFrame
    read_bandwidth: float | None
    target: ModelShape
    drafts: pd.DataFrame

    @classmethod
    def load(cls, directory: str | Path, target: str) -> "MachineFit":
        """A machine's directory; `target` names the target among its shapes.csv (else: the most bytes per step)."""
        directory = Path(directory)
        bandwidth = directory / "bandwidth.json"
        # c measured in decode runs (the study's, then the sweep's) before the fit's own table (c predicted for every
        # configured draft, c measured as profiled forwards): per draft and column, the first value there is.
        drafts = [_draft_c_table(directory / name) for name in DRAFT_C_FILES if (directory / name).exists()]
        shapes = {r.model: ModelShape.from_row(r) for r in pd.read_csv(directory / "shapes.csv").itertuples()}
        shape = shapes.get(target) or max(shapes.values(), key=lambda s: s.step_bytes)
        return cls(directory.parent.name, directory.name, pd.read_csv(directory / "costmodel_terms.csv"),
                   json.loads(bandwidth.read_text())["bytes_per_second"] if bandwidth.exists() else None, shape,
                   pd.concat(drafts, ignore_index=True).groupby("draft", as_index=False, sort=False).first()
                   if drafts else pd.DataFrame())

    def summary(self) -> dict:
        a, a_lo, a_hi = _term(self.terms, "layer_overhead")
        b, b_lo, b_hi = _term(self.terms, "layer_seconds_per_byte")
        params = np.array([_term(self.terms, name)[0] for name in TERMS])
        parts = {k: float(v) for k, v in _step_parts(params, self.target).items()}
        step = sum(parts.values())
        share = parts["depth"] / step
        return {"machine": self.machine, "kernel": self.kernel, "source": "fit",
                "per_layer_overhead_ms": a * 1e3, "per_layer_overhead_ms_lo": a_lo * 1e3,
                "per_layer_overhead_ms_hi": a_hi * 1e3, "bandwidth_eff_gb_s": 1e-9 / b,
                "bandwidth_eff_gb_s_lo": 1e-9 / b_hi, "bandwidth_eff_gb_s_hi": 1e-9 / b_lo,
                "read_bandwidth_gb_s": None if self.read_bandwidth is None else self.read_bandwidth / 1e9,
                "target_step_ms": step * 1e3, "target_overhead_ms": parts["depth"] * 1e3,
                "target_bytes_ms": parts["bytes"] * 1e3, "target_fixed_ms": parts["fixed"] * 1e3,
                "overhead_share": share, "overhead_over_layer_bytes": a / (b * self.target.layer_bytes),
                "regime": regime(share)}

    def draft_rows(self, share: float) -> list[dict]:
        rows = []
        for r in self.drafts.itertuples():
            if not r.draft_layers:  # no model (prompt lookup): no depth or bytes to speak of
                continue
            c_share = share * r.depth_ratio + (1 - share) * r.param_ratio
            rows.append({"machine": self.machine, "kernel": self.kernel, "source": "fit", "draft": r.draft,
                         "kind": r.kind, "depth_ratio": r.depth_ratio, "param_ratio": r.param_ratio,
                         "c_measured": r.c_measured, "c_measured_by": getattr(r, "c_measured_by", None),
                         "c_predicted": r.c_predicted, "c_from_share": c_share,
                         "depth_part_of_c": share * r.depth_ratio / c_share})
        return rows


def reported_rows(name: str, spec: dict) -> tuple[dict, list[dict]]:
    """A machine known from a report only: its measured target and draft steps (ms) and the pair's depth and bytes
    ratios; its overhead share is solved from c (assumptions in spec['assumed'])."""
    c = spec["draft_step_ms"] / spec["target_step_ms"]
    share = share_from_c(c, spec["depth_ratio"], spec["param_ratio"])
    machine = {column: None for column in MACHINE_COLUMNS} | {
        "machine": name, "kernel": spec.get("kernel", "reported"), "source": "reported",
        "target_step_ms": spec["target_step_ms"], "target_overhead_ms": share * spec["target_step_ms"],
        "target_bytes_ms": (1 - share) * spec["target_step_ms"], "overhead_share": share, "regime": regime(share)}
    draft = {"machine": name, "kernel": machine["kernel"], "source": "reported", "draft": spec.get("draft", "draft"),
             "kind": "model", "depth_ratio": spec["depth_ratio"], "param_ratio": spec["param_ratio"],
             "c_measured": c, "c_measured_by": "report", "c_predicted": None, "c_from_share": c,
             "depth_part_of_c": share * spec["depth_ratio"] / c}
    return machine, [draft]


def machines_tables(fits: list[MachineFit], reported: dict[str, dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per machine, one row per (machine, draft)), fitted machines first."""
    machines, drafts = [], []
    for fit in fits:
        summary = fit.summary()
        machines.append(summary)
        drafts += fit.draft_rows(summary["overhead_share"])
    for name, spec in reported.items():
        machine, rows = reported_rows(name, spec)
        machines.append(machine)
        drafts += rows
    return (pd.DataFrame(machines, columns=MACHINE_COLUMNS), pd.DataFrame(drafts, columns=DRAFT_COLUMNS))


def verdict_text(machines: pd.DataFrame, drafts: pd.DataFrame, reported: dict[str, dict]) -> str:
    lines = ["# Depth or bytes: the verdict across machines", "",
             "A step costs n_layers x a (per-layer overhead, scales with depth) + bytes x b (scales with parameters). "
             "With s the share of the target's step that is overhead, c = s x depth ratio + (1 - s) x bytes ratio: "
             "**depth sets the ceiling only where s > 1/2, i.e. where a layer's overhead a exceeds the time its "
             "weights take to stream (b x layer bytes)**; below, bytes do.", ""]
    for r in machines.itertuples():
        where = (f"overhead {r.per_layer_overhead_ms:.2f} ms per layer [{r.per_layer_overhead_ms_lo:.2f}, "
                 f"{r.per_layer_overhead_ms_hi:.2f}], effective bandwidth {r.bandwidth_eff_gb_s:.1f} GB/s, "
                 f"a / (b x layer bytes) = {r.overhead_over_layer_bytes:.2f}; " if r.source == "fit" else "")
        lines.append(f"- **{r.machine}** ({r.kernel}, {r.source}): target step {r.target_step_ms:.0f} ms, {where}"
                     f"s = {r.overhead_share:.0%}: the {r.regime} regime.")
    for name, spec in reported.items():
        lines.append(f"- {name}: assumed {spec.get('assumed', 'nothing beyond the reported steps')}.")
    lines += ["", "Per draft (c measured where the draft ran on that machine; c from s is the relation above):", "",
              drafts.to_markdown(index=False, floatfmt=".3f"), ""]
    return "\n".join(lines)


# --- the best draft per machine ----------------------------------------------------------------------------------
# predicted_speedup is the decoding phase's (no prompt pass); measured_speedup the whole sequence's, next to its
# decoding phase alone (measured_decode_speedup) where the cell measured it.
BEST_COLUMNS = ["machine", "kernel", "domain", "predicted_draft", "predicted_k", "predicted_speedup",
                "measured_draft", "measured_k", "measured_speedup", "measured_decode_speedup",
                "predicted_for_measured_best", "n_candidates"]


def predicted_cells(fit: MachineFit, verify: pd.DataFrame, target_model: str, cells: pd.DataFrame) -> pd.DataFrame:
    """For every (draft, domain, k) cell with a measured tokens per pass (hardware-independent for a greedy run),
    the decode-phase speedup this machine's costs predict: tokens per pass / (k x c + T(k+1)/T(1)), c the draft's
    cost ratio on this machine: 0 for a draft without a model; where the cell measured its c (and the fit of the
    machine it ran on predicted one, the cell's c_predicted), that c scaled by this machine's fitted c over that one
    (a hybrid's c is the share of blocks that run its model times the model's c; on the machine the cell ran on this
    is its measured c); else the fitted c."""
    costs = fit.drafts.set_index("draft") if len(fit.drafts) else pd.DataFrame()
    target_verify = verify[verify["model"] == target_model].set_index("m")["estimate"]
    rows = []
    for r in cells.itertuples():
        fitted = float(costs.loc[r.draft, "c_predicted"]) if r.draft in costs.index else float("nan")
        measured, there = getattr(r, "c_measured", float("nan")), getattr(r, "c_predicted", float("nan"))
        if r.draft_layers == 0:
            c = 0.0
        elif pd.isna(fitted):
            continue  # a draft this machine has no cost for
        elif pd.notna(measured) and pd.notna(there) and there > 0:
            c = float(measured) * fitted / float(there)
        else:
            c = fitted
        v = float(target_verify.get(int(r.k) + 1, float("nan")))
        rows.append({"machine": fit.machine, "kernel": fit.kernel, "draft": r.draft, "domain": r.domain,
                     "k": int(r.k), "tokens_per_pass": r.tokens_per_pass, "c": c, "verify_cost": v,
                     # costs in units of one target step: t_target_1 = 1, t_draft = c, no catch-up call
                     "predicted_speedup": predicted_speedup(r.tokens_per_pass, 1.0, c, v, 0.0, 0.0, k=int(r.k))})
    return pd.DataFrame(rows)


def best_drafts_by_machine(predictions: pd.DataFrame, measured: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """Per (machine, kernel, domain): the draft and k with the highest predicted speedup, next to the best measured
    cell on that machine where it ran cells (measured[(machine, kernel)]: a drafts table) and the prediction for
    that measured best."""
    rows = []
    for (machine, kernel, domain), group in predictions.groupby(["machine", "kernel", "domain"]):
        best = group.loc[group["predicted_speedup"].idxmax()]
        row = {"machine": machine, "kernel": kernel, "domain": domain, "predicted_draft": best["draft"],
               "predicted_k": int(best["k"]), "predicted_speedup": best["predicted_speedup"],
               "measured_draft": None, "measured_k": None, "measured_speedup": None, "measured_decode_speedup": None,
               "predicted_for_measured_best": None, "n_candidates": len(group)}
        ran = measured.get((machine, kernel))
        if ran is not None and len(ran[ran["domain"] == domain]):
            top = ran[ran["domain"] == domain].sort_values("speedup_median").iloc[-1]
            match = group[(group["draft"] == top["draft"]) & (group["k"] == top["k"])]
            row.update(measured_draft=top["draft"], measured_k=int(top["k"]), measured_speedup=top["speedup_median"],
                       measured_decode_speedup=top.get("decode_speedup_median"),
                       predicted_for_measured_best=float(match["predicted_speedup"].iloc[0]) if len(match) else None)
        rows.append(row)
    return pd.DataFrame(rows, columns=BEST_COLUMNS)
