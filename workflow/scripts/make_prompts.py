"""Snakemake script: select one domain's prompts, apply the target's chat template, write
results/prompts/{domain}.parquet.

input:  tokenizer (the model directory, or a file inside it), and one named input per prompt-source set the domain reads
        (e.g. input.humaneval, input.mtbench: the extracted files)
params: domain, domain_spec, prompt_sources ({set: source spec}), n, seed, max_prompt_tokens,
        use_chat_template (default true), system_prompt (default none)
output: the parquet file
"""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

from specdec.study.io import write_parquet
from specdec.study.logs import log_to
from specdec.study.prepare.prompts import domain_source_sets, prompt_table


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        domain = getattr(p, "domain", None) or snakemake.wildcards.domain
        files = {s: getattr(snakemake.input, s) for s in domain_source_sets(p.domain_spec)}
        table = prompt_table({domain: p.domain_spec}, files, p.prompt_sources, snakemake.input.tokenizer, int(p.n),
                             int(p.seed), int(p.max_prompt_tokens), bool(getattr(p, "use_chat_template", True)),
                             getattr(p, "system_prompt", None))
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
