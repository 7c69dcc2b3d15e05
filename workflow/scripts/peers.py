"""Snakemake script: HF generate / HF assisted / our baseline / our speculative decoding on one (draft, domain, k)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.lm import eos_ids_of
from specdec.fp32.loading import load_for_decoding
from specdec.load import load_draft_model
from specdec.runtime import Runtime
from specdec.study.io import read_backend_tables, write_parquet
from specdec.study.logs import log_to
from specdec.study.peers.hf import run_peers_job

log = logging.getLogger("peers")


def main(snakemake):
    with log_to(snakemake.log[0]):
        wc, params = snakemake.wildcards, snakemake.params
        runtime = Runtime(**params.runtime)  # not snakemake.threads: capped at --cores
        target, target_tokenizer = load_for_decoding(
            snakemake.input.target, runtime, read_backend_tables(snakemake.input.get("target_kernels")))
        draft = load_draft_model(wc.draft, dict(params.draft_spec), snakemake.input.draft, target_tokenizer, runtime,
                                 read_backend_tables(snakemake.input.get("draft_kernels")))
        prompts = pd.read_parquet(snakemake.input.prompts).head(int(params.prompts_per_domain))
        log.info("peers: draft %s %s, domain %s, k %s, %d prompts x %s repeats, runtime %s", wc.draft,
                 dict(params.draft_spec), wc.domain, wc.k, len(prompts), params.repeats, runtime)
        runs = run_peers_job(target, draft, prompts, int(wc.k), int(params.max_new_tokens), int(params.repeats),
                             eos_ids_of(target), log=log.info)
        runs.insert(0, "k", int(wc.k))
        runs.insert(0, "domain", wc.domain)
        runs.insert(0, "draft", wc.draft)
        write_parquet(runs, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
