"""Snakemake script: a training prompt set (distillation, feature heads) — per domain, prompts from the training
sources that are NOT among the evaluation prompts (disjoint by source and source id; the evaluation's selection is
recomputed from the config, `evaluation_prompt_ids`), chat-templated like them -> one parquet.

input:  tokenizer, and one named input per prompt-source set the training or the evaluation domains read
params: domains, prompt_sources, per_domain, seed, max_prompt_tokens, use_chat_template,
        evaluation ({domains, per_domain, seed}: the evaluation prompts' selection)
"""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

from specdec.study.io import write_parquet
from specdec.study.logs import log_to
from specdec.study.prepare.prompts import evaluation_prompt_ids, prompt_table, read_domain_frames


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        evaluation = p.evaluation
        files = {s: getattr(snakemake.input, s) for s in p.prompt_sources}
        frames = read_domain_frames(evaluation["domains"], files, p.prompt_sources)
        used = evaluation_prompt_ids(evaluation["domains"], frames, int(evaluation["per_domain"]),
                                     int(evaluation["seed"]))
        table = prompt_table(p.domains, files, p.prompt_sources, snakemake.input.tokenizer, int(p.per_domain),
                             int(p.seed), int(p.max_prompt_tokens), bool(p.use_chat_template), exclude=used)
        overlap = used & set(zip(table["source"], table["source_id"].astype(str)))
        assert not overlap, f"training prompts overlap the evaluation prompts: {sorted(overlap)}"
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
