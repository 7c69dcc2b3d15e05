"""Snakemake script: results/provenance.yaml — config, package versions, machine, date, models (prepared directories,
or the GGUF files the gguf regime runs), job wall times."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import yaml

from specdec.study.io import write_text
from specdec.study.logs import log_to
from specdec.study.provenance import provenance

log = logging.getLogger("provenance")


def main(snakemake):
    with log_to(snakemake.log[0]):
        record = provenance(dict(snakemake.params.config), snakemake.input.models, snakemake.input.benchmarks,
                            int(snakemake.params.threads), snakemake.input.kernels)
        write_text(yaml.safe_dump(record, sort_keys=False), snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
