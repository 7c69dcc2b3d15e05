"""Snakemake script: llama.cpp on one domain's prompts with one draft: per prompt (and repeat) the plain greedy run
and one speculative run per k, back to back in rotating order, each a fresh process on runtime.threads threads; one
parquet row per run with llama.cpp's counters, timings and emitted tokens."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

import pandas as pd

from specdec.study.io import write_parquet
from specdec.study.peers.llamacpp import RunSettings, decode_job
from specdec.study.logs import log_to

log = logging.getLogger("llamacpp_decode")


def first_turn_to_log():
    """The raw output of the first prompt's runs goes to the job's log (the parser's input, for inspection)."""
    seen = set()

    def raw(name, out):
        prompt = name.split()[0]
        if not seen or prompt in seen:
            seen.add(prompt)
            log.info("raw output of %s\n%s", name, out)

    return raw


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        prompts = pd.read_parquet(snakemake.input.prompts)
        if p.prompts_per_domain:
            prompts = prompts.head(int(p.prompts_per_domain))
        threads = int(snakemake.config["runtime"]["threads"])  # not snakemake.threads: capped at --cores
        settings = RunSettings(threads=threads, max_new_tokens=int(p.max_new_tokens),
                               ctx_size=int(p.ctx_size), repack=bool(p.repack))
        frame = decode_job(prompts, bin_dir=Path(snakemake.input.build) / "bin", target=snakemake.input.target,
                           draft=snakemake.input.draft, ks=[int(k) for k in p.ks], settings=settings,
                           repeats=int(p.repeats), log=log.info,
                           raw=first_turn_to_log())
        n_tok = frame["n_prompt_llama"] != frame["n_prompt_tokens"]
        if n_tok.any():
            log.warning("llama.cpp tokenised %d runs' prompts to a different length than input_ids",
                        int(n_tok.sum()))
        write_parquet(frame.assign(draft=snakemake.wildcards.draft, domain=snakemake.wildcards.domain),
                      snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
