"""Snakemake script: per machine measured so far and domain, the draft and k its fitted costs predict to be fastest
from the measured tokens per pass, next to the best cell measured on that machine -> best_drafts_by_machine.csv."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

import pandas as pd

from specdec.study.io import write_csv
from specdec.study.logs import log_to
from specdec.study.cost.verdict import MachineFit, best_drafts_by_machine, predicted_cells

log = logging.getLogger("best_drafts_by_machine")


def main(snakemake):
    with log_to(snakemake.log[0]):
        ran_cells = [Path(p).parent for p in [snakemake.input.current, *snakemake.input.others]]
        measured = {(d.parent.name, d.name): pd.read_csv(d / "drafts.csv") for d in ran_cells}
        # Tokens per pass of a greedy cell do not depend on the machine: every machine's fit is asked about every
        # cell, also a machine that was only profiled (machine_fit) and ran no cell.
        # Where machines ran the same cell, the one over the most prompts speaks for it.
        cells = (pd.concat(measured.values(), ignore_index=True).sort_values("n_prompts", kind="stable")
                 .drop_duplicates(["draft", "domain", "k"], keep="last"))
        fitted = [Path(p).parent for p in snakemake.input.fits]
        predictions = pd.concat([predicted_cells(MachineFit.load(d, snakemake.params.target),
                                                 pd.read_csv(d / "verify_cost.csv"), snakemake.params.target, cells)
                                 for d in fitted], ignore_index=True)
        table = best_drafts_by_machine(predictions, measured)
        log.info("predictions:\n%s\nbest:\n%s", predictions.to_string(index=False), table.to_string(index=False))
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
