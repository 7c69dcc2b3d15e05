"""Snakemake script for the models stage: obtain one model and write resources/models/{model}/ (manifest.json last)."""


import contextlib
from pathlib import Path

from specdec.models import prepare_model


def main(snakemake) -> None:
    # transformers/pip chatter goes to the rule's log too
    with open(snakemake.log[0], "w", buffering=1) as log_file, contextlib.redirect_stdout(log_file), \
            contextlib.redirect_stderr(log_file):

        def log(msg: str) -> None:
            print(msg, file=log_file, flush=True)

        params = snakemake.params
        name = snakemake.wildcards.get("model", Path(snakemake.output[0]).name)
        spec = dict(params.spec)
        spec.setdefault("name", name)
        download_dir = getattr(params, "download_dir", None) or f"resources/downloads/{name}"
        prepare_model(spec, Path(snakemake.output[0]), Path(download_dir),
                      dtype=getattr(params, "dtype", None) or "float32", log=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
