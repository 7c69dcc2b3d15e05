"""Snakemake script: one decoding job (setting, draft, domain, k, seed) -> steps.parquet + sequences.parquet."""

import logging

import pandas as pd

from specdec.io import write_parquet
from specdec.logs import log_to
from specdec.study import DecodeJob, Runtime, load_for_decoding, make_draft, run_decode_job

log = logging.getLogger("decode")


def main(snakemake):
    with log_to(snakemake.log[0]):
        wc, params = snakemake.wildcards, snakemake.params
        job = DecodeJob(setting=wc.setting, draft=wc.draft, domain=wc.domain, k=int(wc.k), seed=int(wc.seed),
                        max_new_tokens=int(params.max_new_tokens), repeats=int(params.repeats), **params.sampling)
        runtime = Runtime(**params.runtime, threads=snakemake.threads)
        log.info("job %s, draft %s, runtime %s", job, params.draft_spec, runtime)
        target, target_tokenizer = load_for_decoding(snakemake.input.target, runtime)
        draft_dir = snakemake.input.get("draft") or None
        draft = make_draft(wc.draft, dict(params.draft_spec), target, target_tokenizer, draft_dir, runtime)
        prompts = pd.read_parquet(snakemake.input.prompts)
        limit = params.get("prompt_limit")  # the sampled setting may use the first N prompts only
        if limit:
            prompts = prompts.head(int(limit))
        steps, sequences = run_decode_job(target, draft, prompts, job, log=log.info)
        write_parquet(steps, snakemake.output.steps)
        write_parquet(sequences, snakemake.output.sequences)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
