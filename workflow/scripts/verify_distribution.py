"""Snakemake script: distribution check of one (draft, domain) on the real pair -> one parquet row per (prompt, k).
N is sized per test for power against a wrong sampler (docs/distribution-check.md); the family is judged by
distribution_table."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.drafts import get_kind, load_plugins
from specdec.loading import Runtime, load_for_decoding
from specdec.study.distribution import DistributionSettings, run_distribution_checks
from specdec.study.io import write_parquet
from specdec.study.jobs import load_draft_model, read_backend_tables
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
        target, target_tokenizer = load_for_decoding(
            snakemake.input.target, runtime, read_backend_tables(snakemake.input.get("target_kernels")))
        draft = None
        if get_kind(spec["kind"]).model is not None:
            draft = load_draft_model(snakemake.wildcards.draft, spec, snakemake.input.draft, target_tokenizer,
                                     runtime, read_backend_tables(snakemake.input.get("draft_kernels")))
        prompts = pd.read_parquet(snakemake.input.prompts)
        rows = run_distribution_checks(target, draft, prompts, settings, draft_spec=spec, family_size=family_size,
                                       log=log.info)
        table = pd.DataFrame(rows)
        table.insert(0, "domain", snakemake.wildcards.domain)
        table.insert(0, "draft", snakemake.wildcards.draft)
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
