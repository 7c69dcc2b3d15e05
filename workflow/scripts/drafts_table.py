"""Snakemake script: drafts.csv, best_drafts.csv and drafts_vs_depth.png: the study's cells (costmodel.csv) and the
draft sweep's, each draft's depth and bytes ratios, c measured and c the cost-model fit predicts (the fit over every
profiled model, the sweep's included)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specdec.drafts import load_plugins  # noqa: E402
from specdec.study.cost.model import (  # noqa: E402
    fit_cost_model,
    predict_draft_cost_ratio,
    profiled_shapes,
)
from specdec.study.io import read_parquets, write_csv, write_figure  # noqa: E402
from specdec.study.logs import log_to  # noqa: E402
from specdec.study.cost.prediction import (  # noqa: E402
    best_per_domain,
    draft_shapes,
    drafts_table,
    per_draft_costs,
    profiled_costmodel_table,
)

log = logging.getLogger("drafts_table")


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
    write_figure(fig, path)


def main(snakemake):
    with log_to(snakemake.log[0]):
        inputs, outputs, params = snakemake.input, snakemake.output, snakemake.params
        load_plugins(params.plugins)
        profiles = read_parquets(inputs.profiles)
        shapes = profiled_shapes(profiles)
        target = shapes[params.target]
        fit = fit_cost_model(profiles, n_boot=int(params.n_boot))
        specs = dict(params.draft_specs)
        by_draft = draft_shapes(specs, shapes, params.target)
        predict_c = lambda shape: predict_draft_cost_ratio(fit, shape, target)  # noqa: E731
        study = pd.read_csv(inputs.costmodel)
        drafts = drafts_table(study, specs, by_draft, target, predict_c, run="study")
        if len(inputs.sweep_sequences):
            sweep = profiled_costmodel_table(profiles, read_parquets(inputs.sweep_steps),
                                             read_parquets(inputs.sweep_sequences), params.target, specs,
                                             profiled_dtype=params.runtime_dtype)
            log.info("draft sweep:\n%s", sweep.to_string(index=False))
            drafts = pd.concat([drafts, drafts_table(sweep, specs, by_draft, target, predict_c, run="sweep")],
                               ignore_index=True)
        write_csv(drafts, outputs.drafts)
        write_csv(drafts, outputs.machine_cells)  # kept with the machine's fit: the cells measured there
        # this machine's c per draft, for `machines`
        write_csv(per_draft_costs(drafts).assign(c_measured_by="decode"), outputs.machine_drafts)
        write_csv(best_per_domain(drafts), outputs.best)
        drafts_plot(drafts, outputs.plot)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
