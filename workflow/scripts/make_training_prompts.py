"""Snakemake script: the distillation prompt set — per domain, prompts from the same sources that are NOT among the
evaluation prompts (disjoint by source and source id), chat-templated like them -> results/prompts/train.parquet."""

import logging
from pathlib import Path

import pandas as pd

from specdec.io import read_parquets, write_parquet
from specdec.logs import log_to
from specdec.prompts import (build_prompt_table, domain_source_sets, model_context_length, read_prompt_source,
                             select_domain_prompts)

log = logging.getLogger("make_training_prompts")


def main(snakemake):
    from transformers import AutoTokenizer

    with log_to(snakemake.log[0]):
        p = snakemake.params
        evaluation = read_parquets(snakemake.input.evaluation)
        used = set(zip(evaluation["source"], evaluation["source_id"].astype(str)))
        tok_dir = Path(snakemake.input.tokenizer)
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        tables = []
        for domain, spec in p.domains.items():
            frames = {}
            for s in domain_source_sets(spec):
                frame = read_prompt_source(getattr(snakemake.input, s), s, p.prompt_sources[s])
                keep = [(s, str(i)) not in used for i in frame["source_id"]]
                frames[s] = frame[keep]
            selected = select_domain_prompts(domain, spec, frames, int(p.per_domain), int(p.seed))
            tables.append(build_prompt_table(selected, tokenizer, int(p.max_prompt_tokens),
                                             model_context_length(tok_dir, tokenizer), bool(p.use_chat_template)))
            log.info("training domain %s: %d prompts (none of the %d evaluation prompts)", domain, len(tables[-1]),
                     len(evaluation))
        table = pd.concat(tables, ignore_index=True)
        overlap = used & set(zip(table["source"], table["source_id"].astype(str)))
        assert not overlap, f"training prompts overlap the evaluation prompts: {sorted(overlap)}"
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
