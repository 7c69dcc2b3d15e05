"""Snakemake script: a truncated or distilled draft (safetensors, resources/models/{draft}/) written as a GGUF file
with its base model's metadata and tokenizer; unchanged tensors keep their original quantisation."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import json
import logging

from specdec.study.peers.llamacpp import export_gguf
from specdec.study.logs import log_to

log = logging.getLogger("llamacpp_export")


def main(snakemake):
    with log_to(snakemake.log[0]):
        how = export_gguf(snakemake.input.model, snakemake.input.base, snakemake.output[0], log=log.info)
        log.info("tensors: %s", json.dumps(how, indent=1))


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
