"""Snakemake script: feature heads' greedy drafts checked offline, by draft position, on the target's greedy answers
to the first prompts of each domain -> tables/head_agreement.csv and .md (specdec/study/training/head_agreement.py). The
target runs from its GGUF file on the lean engine (as the heads' training data were made): its greedy text, and its
features at every position, kept while generating."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.drafts.feature_head import FeatureHead, target_parts
from specdec.gguf.loading import load_gguf_for_decoding
from specdec.runtime import Runtime
from specdec.study.report.analysis import to_markdown
from specdec.study.training.head_agreement import agreement_table, greedy_answers
from specdec.study.io import write_csv, write_text
from specdec.study.logs import log_to

log = logging.getLogger("head_agreement")


def main(snakemake):
    with log_to(snakemake.log[0]):
        session, _ = load_gguf_for_decoding(snakemake.input.target, Runtime(**snakemake.params.runtime),
                                            log=log.info)
        prompts = pd.concat([pd.read_parquet(p).head(snakemake.params.prompts_per_domain)
                             for p in snakemake.input.prompts], ignore_index=True)
        log.info("the target's greedy answers (%d new tokens) to %d prompts", snakemake.params.new_tokens,
                 len(prompts))
        heads = {name: FeatureHead.load(path) for name, path in zip(snakemake.params.heads, snakemake.input.heads)}
        layers = sorted({i for head in heads.values() for i in head.config.fused_layers})  # any head fuses
        answers = greedy_answers(session, prompts, snakemake.params.new_tokens, log=log.info, layers=layers)
        table = agreement_table(target_parts(session), heads, answers, snakemake.params.k, layers)
        write_csv(table, snakemake.output.csv)
        write_text(to_markdown(table) + "\n", snakemake.output.md)
        summary = table.pivot_table(index=["head", "domain"], columns="position", values="tokens_per_pass")
        log.info("tokens a pass by k (offline, greedy):\n%s", summary.round(3).to_string())


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
