"""Snakemake script: the feature heads' training data — each training prompt with the target's greedy continuation
and the target's features at every position, kept while generating -> resources/feature_head/data (sequences.parquet,
features.safetensors); with new_tokens 0, text read in one forward (the corpus; a data directory's sequences: its
text again, e.g. with params.layers' outputs kept beside the features, the answers past their prompts in steps:
params.stepped). Runs the target's GGUF file on the lean engine (engine: gguf) or its prepared model as the study's
runtime loads it (engine: safetensors), on params.runtime as given (the rule sets the engine's weights); resumes from
its params.parts directory after an interruption."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

import pandas as pd

from specdec.study.training.feature_head import SEQUENCES_FILE, head_data
from specdec.study.logs import log_to

log = logging.getLogger("feature_head_data")


def target_session(target: str, engine: str, runtime, kernels):
    """A session over the target that can keep its features, and a description of its weights for the parts' key."""
    if engine == "gguf":
        from specdec.gguf.loading import load_gguf_for_decoding

        session, _ = load_gguf_for_decoding(target, runtime, log=log.info)
    else:
        from specdec.lm import CachedLM
        from specdec.fp32.loading import load_for_decoding
        from specdec.study.io import read_backend_tables

        model, _ = load_for_decoding(target, runtime, read_backend_tables(kernels))
        session = CachedLM(model)
    stat = Path(target).stat()
    return session, {"engine": engine, "target": str(target), "size": stat.st_size, "mtime": int(stat.st_mtime)}


def main(snakemake):
    with log_to(snakemake.log[0]):
        from specdec.runtime import Runtime

        p = snakemake.params
        session, key = target_session(snakemake.input.target, p.engine, Runtime(**p.runtime),
                                       snakemake.input.get("target_kernels"))
        prompts = Path(snakemake.input.prompts)
        prompts = pd.read_parquet(prompts / SEQUENCES_FILE if prompts.is_dir() else prompts)
        layers = [int(i) for i in getattr(p, "layers", None) or []]
        log.info("feature head data: %d prompts x up to %d new tokens on the %s engine%s", len(prompts), p.new_tokens,
                 p.engine, f", keeping layers {layers}'s outputs" if layers else "")
        head_data(session, prompts, int(p.new_tokens), Path(snakemake.output[0]), Path(p.parts), key, log=log.info,
                  layers=layers, stepped=bool(getattr(p, "stepped", False)))


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
