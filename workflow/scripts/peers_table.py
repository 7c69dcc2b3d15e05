"""Snakemake script: the peers runs -> results/tables/peers.csv (medians over prompts x repeats, with intervals)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.io import read_parquets, write_csv
from specdec.study.logs import log_to
from specdec.study.peers.hf import peers_table

log = logging.getLogger("peers_table")


def main(snakemake):
    with log_to(snakemake.log[0]):
        runs = read_parquets(snakemake.input)
        table = peers_table(runs)
        log.info("peers:\n%s", table.to_string(index=False))
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
