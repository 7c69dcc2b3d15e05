"""Snakemake script: the target's greedy continuations of the training prompts and its top-k log-probs there."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.fp32.loading import load_for_decoding
from specdec.runtime import Runtime
from specdec.study.io import read_backend_tables
from specdec.study.training.distill import save_teacher_data, teacher_data
from specdec.study.logs import log_to

log = logging.getLogger("distill_data")


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        runtime = Runtime(**p.runtime)  # not snakemake.threads: capped at --cores
        target, _ = load_for_decoding(snakemake.input.target, runtime,
                                      read_backend_tables(snakemake.input.get("target_kernels")))
        prompts = pd.read_parquet(snakemake.input.prompts)
        log.info("teacher data: %d prompts x %d new tokens, top-%d log-probs", len(prompts), p.new_tokens, p.top_k)
        sequences, tensors = teacher_data(target, prompts, int(p.new_tokens), int(p.top_k), log=log.info)
        save_teacher_data(sequences, tensors, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
