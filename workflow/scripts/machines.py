"""Snakemake script: one verdict on depth vs bytes across every machine measured so far (results/machines/) and the
machines known from reports (config reported_machines) -> machines.csv (+ per-draft rows), verdict, plot."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specdec.study.io import write_csv, write_figure, write_text  # noqa: E402
from specdec.study.logs import log_to  # noqa: E402
from specdec.study.machines import MachineFit, machines_tables, verdict_text  # noqa: E402

log = logging.getLogger("machines")


def machines_plot(drafts: pd.DataFrame, machines: pd.DataFrame, path) -> None:
    """Left: each machine's overhead share s (0: c = bytes ratio, 1: c = depth ratio). Right: c measured against
    c = s x depth + (1 - s) x bytes per (machine, draft)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = machines["machine"] + "\n" + machines["kernel"]
    axes[0].barh(labels, machines["overhead_share"], color=["tab:blue" if s == "fit" else "tab:gray"
                                                            for s in machines["source"]])
    axes[0].axvline(0.5, color="black", linestyle="--", linewidth=1)
    axes[0].set_xlim(0, 1)
    axes[0].set_xlabel("s: per-layer overhead share of the target step (> 0.5: depth sets c)")
    shown = drafts.dropna(subset=["c_measured"])
    sns.scatterplot(shown, x="c_from_share", y="c_measured", hue="machine", style="draft", ax=axes[1], s=60)
    top = max(shown[["c_from_share", "c_measured"]].max().max(), 0.1) * 1.1 if len(shown) else 1.0
    axes[1].plot([0, top], [0, top], color="grey", linewidth=1)
    axes[1].set_xlabel("c = s x depth ratio + (1 - s) x bytes ratio")
    axes[1].set_ylabel("c measured (draft step / target step)")
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    write_figure(fig, path)


def main(snakemake):
    with log_to(snakemake.log[0]):
        terms = [snakemake.input.current[0], *snakemake.input.fits]
        fits = [MachineFit.load(Path(path).parent, snakemake.params.target) for path in terms]
        reported = dict(snakemake.params.reported)
        machines, drafts = machines_tables(fits, reported)
        log.info("machines:\n%s\ndrafts:\n%s", machines.to_string(index=False), drafts.to_string(index=False))
        write_csv(machines, snakemake.output.table)
        write_csv(drafts, snakemake.output.drafts)
        write_text(verdict_text(machines, drafts, reported), snakemake.output.verdict)
        machines_plot(drafts, machines, snakemake.output.plot)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
