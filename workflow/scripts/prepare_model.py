"""Snakemake script for the models stage: obtain one model and write resources/models/{model}/ (manifest.json last)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

from specdec.study.logs import log_to
from specdec.study.prepare.models import prepare_model

log = logging.getLogger("prepare_model")


def main(snakemake) -> None:
    with log_to(snakemake.log[0]):  # transformers/pip chatter goes to the rule's log too
        params = snakemake.params
        name = snakemake.wildcards.get("model", Path(snakemake.output[0]).name)
        spec = dict(params.spec)
        spec.setdefault("name", name)
        download_dir = getattr(params, "download_dir", None) or f"resources/downloads/{name}"
        prepare_model(spec, Path(snakemake.output[0]), Path(download_dir),
                      dtype=getattr(params, "dtype", None) or "float32", log=log.info)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
