"""Snakemake script: one verdict on depth vs bytes across every machine measured so far (results/machines/) and the
machines known from reports (config reported_machines) -> machines.csv (+ per-draft rows), verdict, plot."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specdec.study.io import write_csv, write_figure, write_text  # noqa: E402
from specdec.study.logs import log_to  # noqa: E402
from specdec.study.cost.verdict import MachineFit, machines_tables, verdict_text  # noqa: E402

log = logging.getLogger("machines")


def short_name(machine: str) -> str:
    """A machine id's CPU part (vendor, family and model): the rest is in the tables."""
    return "-".join(machine.split("-")[:3])


def terms_panel(ax, machines: pd.DataFrame) -> None:
    """Each fitted machine's per-layer overhead against its effective bandwidth (95% intervals), with the line where
    the overhead equals the time a target layer's weights take to stream: above it, depth sets c."""
    fitted = machines[machines["source"] == "fit"]
    for r in fitted.itertuples():
        # an interval can miss its estimate (1 / b of a bootstrap interval on b, or a noisy fit of tiny models)
        xerr = np.clip([[r.bandwidth_eff_gb_s - r.bandwidth_eff_gb_s_lo],
                        [r.bandwidth_eff_gb_s_hi - r.bandwidth_eff_gb_s]], 0, None)
        yerr = np.clip([[r.per_layer_overhead_ms - r.per_layer_overhead_ms_lo],
                        [r.per_layer_overhead_ms_hi - r.per_layer_overhead_ms]], 0, None)
        ax.errorbar(r.bandwidth_eff_gb_s, r.per_layer_overhead_ms, xerr=xerr, yerr=yerr, fmt="o", capsize=3,
                    label=f"{short_name(r.machine)} ({r.kernel})")
    if len(fitted):
        first = fitted.iloc[0]  # the target's layer bytes, from a / (b x layer bytes)
        a_seconds, bytes_per_second = first.per_layer_overhead_ms * 1e-3, first.bandwidth_eff_gb_s * 1e9
        layer_bytes = a_seconds * bytes_per_second / first.overhead_over_layer_bytes
        gb_s = np.linspace(1, max(np.nanmax(fitted["bandwidth_eff_gb_s"].abs()) * 1.3, 10), 100)
        ax.plot(gb_s, layer_bytes / (gb_s * 1e9) * 1e3, "k--", linewidth=1, label="overhead = layer bytes / bandwidth")
        # log scale: how many times below the line a machine sits reads directly
        ax.set_yscale("log")
        ax.set_ylim(0.05, max(layer_bytes / (gb_s[0] * 1e9) * 1e3, 1.0))
    ax.set_xlabel("effective bandwidth (GB/s)")
    ax.set_ylabel("per-layer overhead (ms)")
    ax.legend(fontsize=6)


def machines_plot(drafts: pd.DataFrame, machines: pd.DataFrame, path) -> None:
    """Left: each fitted machine's two terms against the depth/bytes line. Middle: each machine's overhead share s
    (0: c = bytes ratio, 1: c = depth ratio). Right: c measured against c = s x depth + (1 - s) x bytes per
    (machine, draft)."""
    fig, axes = plt.subplots(1, 3, figsize=(18, 5), gridspec_kw={"width_ratios": [1.2, 1, 1.2]})
    terms_panel(axes[0], machines)
    axes = axes[1:]
    labels = machines["machine"].map(short_name) + "\n" + machines["kernel"]
    axes[0].barh(labels, machines["overhead_share"], color=["tab:blue" if s == "fit" else "tab:gray"
                                                            for s in machines["source"]])
    axes[0].axvline(0.5, color="black", linestyle="--", linewidth=1)
    axes[0].set_xlim(0, 1)
    axes[0].set_xlabel("s: per-layer overhead share of the target step (> 0.5: depth sets c)")
    shown = drafts.dropna(subset=["c_measured"])
    shown = shown.assign(machine=shown["machine"].map(short_name) + " (" + shown["kernel"] + ")")
    sns.scatterplot(shown, x="c_from_share", y="c_measured", hue="machine", style="draft", ax=axes[1], s=60)
    top = max(shown[["c_from_share", "c_measured"]].max().max(), 0.1) * 1.1 if len(shown) else 1.0
    axes[1].plot([0, top], [0, top], color="grey", linewidth=1)
    axes[1].set_xlabel("c = s x depth ratio + (1 - s) x bytes ratio")
    axes[1].set_ylabel("c measured (draft step / target step)")
    axes[1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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
