"""Snakemake script: all sequences -> results/tables/study.csv and its markdown twin."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.report.analysis import study_table, to_markdown
from specdec.study.io import read_parquets, write_csv, write_text
from specdec.study.logs import log_to

log = logging.getLogger("study_table")


def main(snakemake):
    with log_to(snakemake.log[0]):
        sequences = read_parquets(snakemake.input)
        table = study_table(sequences)
        log.info("\n%s", table.to_string(index=False))
        write_csv(table, snakemake.output.csv)
        write_text(to_markdown(table), snakemake.output.md)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
