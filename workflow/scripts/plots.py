"""Snakemake script: acceptance heatmap (domain x k) and speedup vs k per domain with bootstrap intervals."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specdec.study.io import write_figure  # noqa: E402
from specdec.study.logs import log_to  # noqa: E402


def acceptance_heatmap(table: pd.DataFrame, path) -> None:
    greedy = table[table["temperature"] == 0]
    drafts = list(greedy["draft"].unique())
    fig, axes = plt.subplots(1, len(drafts), figsize=(4.5 * len(drafts) + 1, 3.6), squeeze=False)
    for ax, draft in zip(axes[0], drafts):
        grid = greedy[greedy["draft"] == draft].pivot(index="domain", columns="k", values="acceptance")
        sns.heatmap(grid, annot=True, fmt=".2f", vmin=0, vmax=1, cmap="viridis", ax=ax)
        ax.set_title(f"acceptance, greedy\ndraft {draft}")
    fig.tight_layout()
    write_figure(fig, path)


def speedup_vs_k(table: pd.DataFrame, path) -> None:
    grid = sns.FacetGrid(table.assign(setting=table["temperature"].map(lambda t: f"T={t:g}")),
                         col="draft", row="setting", hue="domain", height=3.4, aspect=1.3, sharey=True)

    def with_interval(data, color, label):
        data = data.sort_values("k")
        plt.errorbar(data["k"], data["speedup_median"],
                     yerr=[data["speedup_median"] - data["speedup_lo"], data["speedup_hi"] - data["speedup_median"]],
                     marker="o", capsize=3, color=color, label=label)

    grid.map_dataframe(with_interval)
    for ax in grid.axes.flat:
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (draft tokens per block)")
        ax.set_ylabel("wall speedup (baseline s / speculative s)")
    grid.add_legend()
    write_figure(grid.figure, path)


def main(snakemake):
    with log_to(snakemake.log[0]):
        table = pd.read_csv(snakemake.input[0])
        acceptance_heatmap(table, snakemake.output.heatmap)
        speedup_vs_k(table, snakemake.output.speedup)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
