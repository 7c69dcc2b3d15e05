"""Snakemake script: the peers runs -> results/tables/peers.csv (medians over prompts x repeats, with intervals)."""

import logging

from specdec.io import read_parquets, write_csv
from specdec.logs import log_to
from specdec.peers import peers_table

log = logging.getLogger("peers_table")


def main(snakemake):
    with log_to(snakemake.log[0]):
        runs = read_parquets(snakemake.input)
        table = peers_table(runs)
        log.info("peers:\n%s", table.to_string(index=False))
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
