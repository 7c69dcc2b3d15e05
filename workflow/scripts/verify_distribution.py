"""Snakemake script: distribution check of one (draft, domain) on the real pair -> one parquet row per (prompt, k)."""

import logging

import pandas as pd

from specdec.distribution import DistributionSettings, run_distribution_checks
from specdec.io import write_parquet
from specdec.logs import log_to
from specdec.study import Runtime, load_draft_model, load_for_decoding

log = logging.getLogger("verify_distribution")


def main(snakemake):
    with log_to(snakemake.log[0]):
        settings = dict(snakemake.params.settings)
        settings.pop("alpha", None)  # judged over the whole family by distribution_table
        settings = DistributionSettings(**{**settings, "k": tuple(settings.get("k", (1, 4)))})
        runtime = Runtime(**snakemake.params.runtime, threads=snakemake.threads)
        log.info("draft %s, domain %s, %s, runtime %s", snakemake.wildcards.draft, snakemake.wildcards.domain,
                 settings, runtime)
        target, target_tokenizer = load_for_decoding(snakemake.input.target, runtime)
        draft = load_draft_model(snakemake.wildcards.draft, dict(snakemake.params.draft_spec), snakemake.input.draft,
                                 target_tokenizer, runtime)
        prompts = pd.read_parquet(snakemake.input.prompts)
        rows = run_distribution_checks(target, draft, prompts, settings,
                                       min_confidence=snakemake.params.draft_spec.get("min_confidence"), log=log.info)
        table = pd.DataFrame(rows)
        table.insert(0, "domain", snakemake.wildcards.domain)
        table.insert(0, "draft", snakemake.wildcards.draft)
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
