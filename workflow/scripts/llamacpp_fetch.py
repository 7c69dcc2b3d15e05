"""Snakemake script: the pinned llama-cpp-python source archive (it vendors llama.cpp), fetched once with pip as a
file (never built or installed) and checked against the sha256 pinned in config.yaml."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.peers.llamacpp import fetch_source
from specdec.study.logs import log_to

log = logging.getLogger("llamacpp_fetch")


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        fetch_source(p.package, p.version, p.sha256, p.download_dir, snakemake.output[0], log=log.info)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
