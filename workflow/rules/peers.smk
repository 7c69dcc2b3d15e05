# Peers (`snakemake --cores 2 peers`): Hugging Face generate and assisted generation against our baseline and
# speculative decoding, same models, prompts and settings, interleaved in one process (greedy).


rule peers_run:
    input:
        unpack(fp32_only("peers_run (Hugging Face's generate on the same weights)")),
        unpack(draft_model_input),
        unpack(kernel_inputs),
        target=model_dir(config["target"]),
        prompts=f"{R}/prompts/{{domain}}.parquet",
    output:
        f"{R}/peers/{{draft}}/{{domain}}/k{{k}}.parquet",
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        max_new_tokens=DECODING["max_new_tokens"],
        prompts_per_domain=(PEERS or {}).get("prompts_per_domain", 3),
        repeats=(PEERS or {}).get("repeats", 1),
        runtime=RUNTIME,
    threads: THREADS
    resources:
        mem_mb=14000,
        gpu=1 if RUNTIME["device"] == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/peers/{{draft}}/{{domain}}/k{{k}}.log",
    benchmark:
        f"{BENCH}/peers/{{draft}}/{{domain}}/k{{k}}.tsv"
    script:
        "../scripts/peers.py"


rule peers_table:
    input:
        peers_files(),
    output:
        report(f"{R}/tables/peers.csv", caption="../report/peers.rst", category="Peers"),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/peers/peers_table.log",
    script:
        "../scripts/peers_table.py"


rule peers:
    input:
        f"{R}/tables/peers.csv",
