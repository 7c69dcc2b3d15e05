"""Snakemake script: distribution check of one (draft, domain) on the real pair -> one parquet row per (prompt, k).
N is sized per test for power against a wrong sampler (docs/distribution-check.md); the family is judged by
distribution_table."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.drafts import get_kind, load_plugins
from specdec.load import load_draft_model, load_target
from specdec.runtime import Runtime
from specdec.study.verify.distribution import run_distribution_checks
from specdec.study.verify.distribution_verdict import DistributionSettings
from specdec.study.io import read_backend_tables, write_parquet
from specdec.study.logs import log_to

log = logging.getLogger("verify_distribution")


def main(snakemake):
    with log_to(snakemake.log[0]):
        params = snakemake.params
        load_plugins(params.plugins)
        settings = DistributionSettings.from_config(params.settings)
        spec = dict(params.draft_spec)
        family_size = settings.family_size(int(params.n_jobs))
        runtime = Runtime(**params.runtime)  # not snakemake.threads: capped at --cores
        log.info("draft %s (%s), domain %s, %s, family of %d tests, runtime %s", snakemake.wildcards.draft, spec,
                 snakemake.wildcards.domain, settings, family_size, runtime)
        prompts = pd.read_parquet(snakemake.input.prompts)
        # runtime.weights gguf: LeanLM sessions (the prefix memos use them as they are), each with a KV cache as long
        # as the longest sequence a check feeds; safetensors: the prepared models
        longest = int(prompts["input_ids"].head(settings.prompts_per_domain).map(len).max()) + settings.tokens \
            + max(settings.k) + 1
        target, target_tokenizer = load_target(snakemake.input.target, runtime,
                                               read_backend_tables(snakemake.input.get("target_kernels")), longest)
        draft = None
        if get_kind(spec["kind"]).model is not None:
            draft = load_draft_model(snakemake.wildcards.draft, spec, snakemake.input.get("draft"), target_tokenizer,
                                     runtime, read_backend_tables(snakemake.input.get("draft_kernels")),
                                     target=target)
        rows = run_distribution_checks(target, draft, prompts, settings, draft_spec=spec, family_size=family_size,
                                       log=log.info)
        table = pd.DataFrame(rows)
        table.insert(0, "domain", snakemake.wildcards.domain)
        table.insert(0, "draft", snakemake.wildcards.draft)
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
