"""Snakemake script: the distillation prompt set — per domain, prompts from the same sources that are NOT among the
evaluation prompts (disjoint by source and source id), chat-templated like them -> results/prompts/train.parquet."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

from specdec.study.io import read_parquets, write_parquet
from specdec.study.logs import log_to
from specdec.study.prompts import domain_source_sets, prompt_table


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        evaluation = read_parquets(snakemake.input.evaluation)
        used = frozenset(zip(evaluation["source"], evaluation["source_id"].astype(str)))
        files = {s: getattr(snakemake.input, s) for spec in p.domains.values() for s in domain_source_sets(spec)}
        table = prompt_table(p.domains, files, p.prompt_sources, snakemake.input.tokenizer, int(p.per_domain),
                             int(p.seed), int(p.max_prompt_tokens), bool(p.use_chat_template), exclude=used)
        overlap = used & set(zip(table["source"], table["source_id"].astype(str)))
        assert not overlap, f"training prompts overlap the evaluation prompts: {sorted(overlap)}"
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
