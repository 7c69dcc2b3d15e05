"""Snakemake script: fit the cost model on the profiles, audit its speedup prediction against the decode runs,
write the verdict on depth vs parameters, the roofline, and the two plots."""

import json
import logging

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specdec.analysis import to_markdown  # noqa: E402
from specdec.costmodel import (ModelShape, audited_step_timings, depth_vs_parameters_verdict, fit_cost_model,  # noqa: E402
                               predict_draft_cost_ratio)
from specdec.io import atomic_path, read_parquets, write_csv, write_text  # noqa: E402
from specdec.logs import log_to  # noqa: E402
from specdec.prediction import (best_per_domain, draft_shapes, drafts_table, profiled_costmodel_table,  # noqa: E402
                                roofline)

log = logging.getLogger("costmodel")


def shapes_of(profiles: pd.DataFrame) -> dict[str, ModelShape]:
    first = profiles.groupby("model").first()
    return {name: ModelShape(int(r.n_layers), int(r.hidden_size), int(r.intermediate_size), int(r.vocab_size),
                             int(r.dtype_bytes), int(r.kv_dim)) for name, r in first.iterrows()}


def candidate_shapes(target: ModelShape, drafts: dict[str, ModelShape]) -> dict[str, ModelShape]:
    """The profiled drafts, shallower cuts of each, and early exits of the target: what a draft could look like."""
    candidates = dict(drafts)
    for name, shape in drafts.items():
        for layers in sorted({shape.n_layers // 2, shape.n_layers // 4} - {0}):
            candidates[f"{name} cut to {layers} layers"] = ModelShape(layers, shape.hidden, shape.intermediate,
                                                                      shape.vocab, shape.dtype_bytes, shape.kv_dim)
    for layers in [n for n in (4, 8) if n < target.n_layers] or [max(target.n_layers // 2, 1)]:
        candidates[f"target's first {layers} layers"] = ModelShape(layers, target.hidden, target.intermediate,
                                                                   target.vocab, target.dtype_bytes, target.kv_dim)
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
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def audit_plot(table: pd.DataFrame, tolerance: float, path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(table, x="measured_speedup", y="predicted_speedup", hue="domain", style="draft", size="k",
                    ax=ax)
    lo = min(table["measured_speedup"].min(), table["predicted_speedup"].min()) * 0.9
    hi = max(table["measured_speedup"].max(), table["predicted_speedup"].max()) * 1.1
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    ax.fill_between([lo, hi], [lo * (1 - tolerance), hi * (1 - tolerance)], [lo * (1 + tolerance), hi * (1 + tolerance)],
                    color="grey", alpha=0.15, label=f"±{tolerance:.0%}")
    ax.set_xlabel("measured speedup (median over prompts)")
    ax.set_ylabel("predicted speedup (profiled costs, measured acceptance)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def drafts_plot(drafts: pd.DataFrame, path) -> None:
    """Speedup and c against the depth ratio and against the parameter ratio: best k per (draft, domain) on top,
    per draft the median measured c (dots) and the fitted c (crosses) below."""
    best_k = drafts.loc[drafts.groupby(["draft", "domain"])["speedup_median"].idxmax()]
    per_draft = drafts.groupby(["draft", "kind"]).agg(
        depth_ratio=("depth_ratio", "first"), param_ratio=("param_ratio", "first"),
        c_measured=("c_measured", "median"), c_predicted=("c_predicted", "first")).reset_index()
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, ratio in enumerate(["depth_ratio", "param_ratio"]):
        sns.scatterplot(best_k, x=ratio, y="speedup_median", hue="draft", style="domain", ax=axes[0, col], s=60)
        axes[0, col].axhline(1.0, color="grey", linestyle="--", linewidth=1)
        axes[0, col].set_ylabel("median speedup (best k)")
        axes[0, col].legend(fontsize=6)
        sns.scatterplot(per_draft, x=ratio, y="c_measured", hue="draft", ax=axes[1, col], s=60, marker="o",
                        legend=False)
        axes[1, col].scatter(per_draft[ratio], per_draft["c_predicted"], marker="x", color="black",
                             label="c predicted (fit)")
        limit = max(per_draft[ratio].max(), 0.05) * 1.1
        axes[1, col].plot([0, limit], [0, limit], color="grey", linewidth=1, label="c = ratio")
        axes[1, col].set_ylabel("c (draft step / target step)")
        axes[1, col].legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def main(snakemake):
    with log_to(snakemake.log[0]):
        inputs, outputs, params = snakemake.input, snakemake.output, snakemake.params
        profiles = read_parquets(inputs.profiles)
        steps = read_parquets(inputs.steps)
        sequences = read_parquets(inputs.sequences)
        bandwidth = json.loads(open(inputs.bandwidth).read())["bytes_per_second"]
        shapes = shapes_of(profiles)
        target = shapes[params.target]
        drafts = {name: shape for name, shape in shapes.items() if name != params.target}

        fit = fit_cost_model(profiles, n_boot=int(params.n_boot))
        verdict = depth_vs_parameters_verdict(fit, target, candidate_shapes(target, drafts))
        log.info("%s", verdict.text)
        dtype = params.runtime_dtype
        table = profiled_costmodel_table(profiles, steps, sequences, params.target, dict(params.draft_specs),
                                         profiled_dtype=dtype)
        log.info("audit:\n%s", table.to_string(index=False))

        specs = {**params.draft_specs, **params.sweep_specs}
        shapes_by_draft = draft_shapes(specs, shapes, params.target)
        predict_c = lambda shape: predict_draft_cost_ratio(fit, shape, target)  # noqa: E731
        drafts = drafts_table(table, specs, shapes_by_draft, target, predict_c, run="study")
        if len(inputs.sweep_sequences):
            sweep_steps = read_parquets(inputs.sweep_steps)
            sweep_sequences = read_parquets(inputs.sweep_sequences)
            sweep = profiled_costmodel_table(profiles, sweep_steps, sweep_sequences, params.target, specs,
                                             profiled_dtype=dtype)
            log.info("draft sweep:\n%s", sweep.to_string(index=False))
            drafts = pd.concat([drafts, drafts_table(sweep, specs, shapes_by_draft, target, predict_c, run="sweep")],
                               ignore_index=True)
        write_csv(drafts, outputs.drafts)
        write_csv(best_per_domain(drafts), outputs.best)
        drafts_plot(drafts, outputs.drafts_plot)
        write_csv(table, outputs.table)
        write_csv(fit.terms, outputs.terms)
        write_csv(fit.verify, outputs.verify)
        write_csv(audited_step_timings(steps[steps["setting"] == "greedy"]), outputs.timings)
        write_csv(roofline(profiles, bandwidth, params.target, steps), outputs.roofline)
        write_text(verdict_markdown(fit, verdict, table, float(params.tolerance)), outputs.verdict)
        layer_time_plot(profiles, outputs.layer_plot)
        audit_plot(table, float(params.tolerance), outputs.audit_plot)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
