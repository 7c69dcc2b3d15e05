"""Snakemake script: the target's greedy continuations of the training prompts and its top-k log-probs there."""

import logging

import pandas as pd

from specdec.distill import save_teacher_data, teacher_data
from specdec.logs import log_to
from specdec.study import Runtime, load_for_decoding

log = logging.getLogger("distill_data")


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        runtime = Runtime(**p.runtime, threads=snakemake.threads)
        target, _ = load_for_decoding(snakemake.input.target, runtime)
        prompts = pd.read_parquet(snakemake.input.prompts)
        log.info("teacher data: %d prompts x %d new tokens, top-%d log-probs", len(prompts), p.new_tokens, p.top_k)
        sequences, tensors = teacher_data(target, prompts, int(p.new_tokens), int(p.top_k), log=log.info)
        save_teacher_data(sequences, tensors, snakemake.output[0])


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
