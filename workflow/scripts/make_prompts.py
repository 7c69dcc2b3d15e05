"""Snakemake script: select one domain's prompts, apply the target's chat template, write results/prompts/{domain}.parquet.

input:  tokenizer (the model directory, or a file inside it), and one named input per prompt-source set the domain reads
        (e.g. input.humaneval, input.mtbench: the extracted files)
params: domain, domain_spec, prompt_sources ({set: source spec}), n, seed, max_prompt_tokens,
        use_chat_template (default true), system_prompt (default none)
output: the parquet file
"""

import logging
from pathlib import Path

from specdec.logs import log_to
from specdec.io import write_parquet
from specdec.prompts import (build_prompt_table, domain_source_sets, model_context_length, read_prompt_source,
                             select_domain_prompts)

log = logging.getLogger("make_prompts")




def make_prompts(domain, domain_spec, source_files, prompt_sources, tokenizer_path, n, seed, max_prompt_tokens,
                 use_chat_template=True, system_prompt=None):
    from transformers import AutoTokenizer

    frames = {s: read_prompt_source(source_files[s], s, prompt_sources[s]) for s in domain_source_sets(domain_spec)}
    for s, f in frames.items():
        log.info("source %s: %d prompts, categories %s", s, len(f), f["category"].value_counts().to_dict())
    selected = select_domain_prompts(domain, domain_spec, frames, n, seed)
    tok_dir = Path(tokenizer_path)
    tok_dir = tok_dir if tok_dir.is_dir() else tok_dir.parent
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    table = build_prompt_table(selected, tokenizer, max_prompt_tokens, model_context_length(tok_dir, tokenizer),
                               use_chat_template, system_prompt)
    log.info("domain %s: %d prompts, tokens min/median/max %d/%d/%d", domain, len(table), table["n_tokens"].min(),
             int(table["n_tokens"].median()), table["n_tokens"].max())
    for pid, k in zip(table["prompt_id"], table["n_tokens"]):
        log.info("  %s: %d tokens", pid, k)
    return table


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        domain = getattr(p, "domain", None) or snakemake.wildcards.domain
        sets = domain_source_sets(p.domain_spec)
        table = make_prompts(domain, p.domain_spec, {s: getattr(snakemake.input, s) for s in sets}, p.prompt_sources,
                             snakemake.input.tokenizer, int(p.n), int(p.seed), int(p.max_prompt_tokens),
                             bool(getattr(p, "use_chat_template", True)), getattr(p, "system_prompt", None))
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
