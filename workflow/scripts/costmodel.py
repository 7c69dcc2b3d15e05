"""Snakemake script: fit the cost model on this machine's profiles, audit its speedup prediction against the decode
runs, write the verdict on depth vs parameters, the roofline and the two plots; keep the drafts' c measured in the
decode runs with the machine's profiles (results/machines/{machine}/{kernel}/drafts_c.csv; the fit itself is
machine_fit's)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import json
import logging
from dataclasses import replace
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specdec.drafts import load_plugins  # noqa: E402
from specdec.study.report.analysis import to_markdown  # noqa: E402
from specdec.study.cost.model import (  # noqa: E402
    ModelShape,
    audited_step_timings,
    depth_vs_parameters_verdict,
    fit_cost_model,
    predict_draft_cost_ratio,
    profiled_shapes,
)
from specdec.study.io import read_parquets, write_csv, write_figure, write_text  # noqa: E402
from specdec.study.logs import log_to  # noqa: E402
from specdec.study.cost.prediction import (  # noqa: E402
    draft_shapes,
    drafts_table,
    per_draft_costs,
    profiled_costmodel_table,
    roofline,
)

log = logging.getLogger("costmodel")


def candidate_shapes(target: ModelShape, drafts: dict[str, ModelShape]) -> dict[str, ModelShape]:
    """The profiled drafts, shallower cuts of each, and early exits of the target: what a draft could look like."""
    candidates = dict(drafts)
    for name, shape in drafts.items():
        for layers in sorted({shape.n_layers // 2, shape.n_layers // 4} - {0}):
            candidates[f"{name} cut to {layers} layers"] = replace(shape, n_layers=layers)
    for layers in [n for n in (4, 8) if n < target.n_layers] or [max(target.n_layers // 2, 1)]:
        candidates[f"target's first {layers} layers"] = replace(target, n_layers=layers)
    return candidates


def verdict_markdown(fit, verdict, table: pd.DataFrame, tolerance: float) -> str:
    inside = (table["rel_error"].abs() <= tolerance)
    lines = ["# Cost model verdict", "", verdict.text, "",
             f"Fitted terms at m = 1 (95% bootstrap intervals over repeats): see costmodel_terms.csv. "
             f"Share of a typical layer's time that is per-layer overhead (scales with depth): "
             f"{fit.overhead_share.estimate:.1%} [{fit.overhead_share.lo:.1%}, {fit.overhead_share.hi:.1%}]; "
             f"dominant term: {fit.dominant}.", "",
             "## Predicted c for candidate draft shapes", "",
             to_markdown(verdict.table[["model", "n_layers", "c", "c_lo", "c_hi", "depth_ratio", "parameter_ratio",
                                        "c_closer_to"]]), "",
             f"## Audit: {int(inside.sum())} of {len(table)} cells within |rel_error| <= {tolerance:.0%}", "",
             to_markdown(table[["draft", "domain", "k", "acceptance", "tokens_per_pass", "c", "verify_cost_ratio",
                                "predicted_speedup", "measured_speedup", "rel_error"]])]
    return "\n".join(lines) + "\n"


def layer_time_plot(profiles: pd.DataFrame, path) -> None:
    layers = profiles[(profiles["component"] == "layer") & (profiles["m"].isin([1, profiles["m"].max()]))]
    per_layer = layers.groupby(["model", "hidden_size", "m", "layer"])["seconds"].median().reset_index()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    sns.stripplot(per_layer.assign(ms=per_layer["seconds"] * 1e3), x="hidden_size", y="ms", hue="m", dodge=True,
                  ax=ax, alpha=0.7)
    ax.set_xlabel("hidden size (layer width)")
    ax.set_ylabel("median seconds per decoder layer (ms)")
    ax.set_title("per-layer time vs layer width, one point per layer")
    fig.tight_layout()
    write_figure(fig, path)


def audit_plot(table: pd.DataFrame, tolerance: float, path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(table, x="measured_speedup", y="predicted_speedup", hue="domain", style="draft", size="k",
                    ax=ax)
    lo = min(table["measured_speedup"].min(), table["predicted_speedup"].min()) * 0.9
    hi = max(table["measured_speedup"].max(), table["predicted_speedup"].max()) * 1.1
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    ax.fill_between([lo, hi], [lo * (1 - tolerance), hi * (1 - tolerance)],
                    [lo * (1 + tolerance), hi * (1 + tolerance)],
                    color="grey", alpha=0.15, label=f"±{tolerance:.0%}")
    ax.set_xlabel("measured speedup (median over prompts)")
    ax.set_ylabel("predicted speedup (profiled costs, measured acceptance)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    write_figure(fig, path)


def machine_drafts(table: pd.DataFrame, specs: dict, shapes: dict, target_name: str, fit) -> pd.DataFrame:
    """Per studied draft on this machine: c measured in the decode runs and c the fit predicts."""
    target = shapes[target_name]
    predict_c = lambda shape: predict_draft_cost_ratio(fit, shape, target)  # noqa: E731
    return per_draft_costs(drafts_table(table, specs, draft_shapes(specs, shapes, target_name), target, predict_c))


def main(snakemake):
    with log_to(snakemake.log[0]):
        inputs, outputs, params = snakemake.input, snakemake.output, snakemake.params
        load_plugins(params.plugins)
        profiles = read_parquets(inputs.profiles)
        steps = read_parquets(inputs.steps)
        sequences = read_parquets(inputs.sequences)
        bandwidth = json.loads(open(inputs.bandwidth).read())["bytes_per_second"]
        shapes = profiled_shapes(profiles)
        target = shapes[params.target]
        drafts = {name: shape for name, shape in shapes.items() if name != params.target}

        fit = fit_cost_model(profiles, n_boot=int(params.n_boot))
        verdict = depth_vs_parameters_verdict(fit, target, candidate_shapes(target, drafts))
        log.info("%s", verdict.text)
        specs = dict(params.draft_specs)
        table = profiled_costmodel_table(profiles, steps, sequences, params.target, specs,
                                         profiled_dtype=params.runtime_dtype)
        log.info("audit:\n%s", table.to_string(index=False))
        write_csv(table, outputs.table)
        write_csv(fit.terms, outputs.terms)
        write_csv(fit.verify, outputs.verify)
        write_csv(machine_drafts(table, specs, shapes, params.target, fit).assign(c_measured_by="decode"),
                  outputs.machine_drafts)
        write_csv(audited_step_timings(steps[steps["setting"] == "greedy"]), outputs.timings)
        write_csv(roofline(profiles, bandwidth, params.target, steps), outputs.roofline)
        write_text(verdict_markdown(fit, verdict, table, float(params.tolerance)), outputs.verdict)
        layer_time_plot(profiles, outputs.layer_plot)
        audit_plot(table, float(params.tolerance), outputs.audit_plot)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
