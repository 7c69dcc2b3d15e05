# Reproduce (`snakemake --cores 2 reproduce`): rerun a subset of the greedy grid from scratch (fresh process,
# `reproduce.repeats` timing repeats) and check that tokens, acceptance and tokens per pass equal the first run's;
# report the spread of wall speedups.


use rule decode as reproduce_decode with:
    output:
        steps=f"{R}/reproduce/runs/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}/steps.parquet",
        sequences=f"{R}/reproduce/runs/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}/sequences.parquet",
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        plugins=PLUGINS,
        sampling=sampling_params,
        max_new_tokens=DECODING["max_new_tokens"],
        repeats=REPRODUCE.get("repeats", 3),
        runtime=RUNTIME,
        prompt_limit=REPRODUCE.get("prompts_per_domain"),
    log:
        f"{LOG}/reproduce/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/reproduce/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}.tsv"


rule reproduce_table:
    input:
        first=[f"{R}/runs/greedy/{d}/{dom}/k{k}/seed0/sequences.parquet" for d, dom, k in reproduce_cells()],
        rerun=[f"{R}/reproduce/runs/greedy/{d}/{dom}/k{k}/seed0/sequences.parquet" for d, dom, k in reproduce_cells()],
    output:
        report(f"{R}/tables/reproduce.csv", caption="../report/reproduce.rst", category="Cost model"),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/reproduce/reproduce_table.log",
    script:
        "../scripts/reproduce_table.py"


rule reproduce:
    input:
        f"{R}/tables/reproduce.csv",
