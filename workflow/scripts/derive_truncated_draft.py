"""Snakemake script: a truncated draft — the first N decoder layers of a prepared model + its final norm and LM head."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.logs import log_to
from specdec.study.prepare.models import derive_truncated

log = logging.getLogger("derive_truncated_draft")


def main(snakemake):
    with log_to(snakemake.log[0]):
        out = derive_truncated(snakemake.input[0], snakemake.output[0], int(snakemake.params.layers))
        log.info("derived %s (%d layers of %s)", out, snakemake.params.layers, snakemake.input[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
