"""Snakemake script: one decoding job (setting, draft, domain, k, seed) -> steps.parquet + sequences.parquet.

The draft sweep runs several k in one job (params.ks, one baseline for all): its outputs are lists, one file per k."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.drafts import load_plugins
from specdec.load import load_target, make_draft
from specdec.runtime import Runtime
from specdec.study.decoding.jobs import DecodeJob, run_decode_jobs
from specdec.study.io import read_backend_tables, write_parquet
from specdec.study.logs import log_to

log = logging.getLogger("decode")


def _as_list(paths) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def main(snakemake):
    with log_to(snakemake.log[0]):
        wc, params = snakemake.wildcards, snakemake.params
        load_plugins(params.plugins)
        ks = [int(k) for k in (params.get("ks") or [wc.k])]
        job = DecodeJob(setting=wc.setting, draft=wc.draft, domain=wc.domain, k=ks[0], seed=int(wc.seed),
                        max_new_tokens=int(params.max_new_tokens), repeats=int(params.repeats), **params.sampling)
        runtime = Runtime(**params.runtime)  # not snakemake.threads: capped at --cores
        log.info("job %s at k %s, draft %s, runtime %s", job, ks, params.draft_spec, runtime)
        prompts = pd.read_parquet(snakemake.input.prompts)
        limit = params.get("prompt_limit")  # the sampled setting and the sweep may use the first N prompts only
        if limit:
            prompts = prompts.head(int(limit))
        # runtime.weights gguf: a static KV cache as long as the longest sequence of this job (the target's input
        # is then its GGUF file, the tokenizer its vocabulary); safetensors: a prepared model directory
        longest = int(prompts["input_ids"].map(len).max()) + job.max_new_tokens + 1
        target, target_tokenizer = load_target(snakemake.input.target, runtime,
                                               read_backend_tables(snakemake.input.get("target_kernels")), longest)
        draft = make_draft(wc.draft, dict(params.draft_spec), target, target_tokenizer,
                           snakemake.input.get("draft"), runtime,
                           read_backend_tables(snakemake.input.get("draft_kernels")))
        runs = run_decode_jobs(target, draft, prompts, job, ks, log=log.info)
        for k, steps_path, sequences_path in zip(ks, _as_list(snakemake.output.steps),
                                                 _as_list(snakemake.output.sequences), strict=True):
            steps, sequences = runs[k]
            write_parquet(steps, steps_path)
            write_parquet(sequences, sequences_path)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
