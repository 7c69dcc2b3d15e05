"""Snakemake script: compare a from-scratch rerun with the first run (tokens, acceptance, tokens per pass must be
identical) and report the spread of wall speedups across repeats; fail if anything hardware-independent moved."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.report.analysis import reproduction_table
from specdec.study.io import read_parquets, write_csv
from specdec.study.logs import log_to

log = logging.getLogger("reproduce_table")


class NotReproducedError(RuntimeError):
    pass


def main(snakemake):
    with log_to(snakemake.log[0]):
        first = read_parquets(snakemake.input.first)
        rerun = read_parquets(snakemake.input.rerun)
        table = reproduction_table(first, rerun)
        log.info("reproduction:\n%s", table.to_string(index=False))
        if not table["reproduced"].all():
            bad = table[~table["reproduced"]]
            raise NotReproducedError(f"the rerun changed tokens, acceptance or tokens per pass: "
                                     f"{bad.to_dict('records')}")
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
