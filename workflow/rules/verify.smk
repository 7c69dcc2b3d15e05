# Verification: greedy speculative output must equal greedy baseline output, token for token.


rule verify_greedy:
    input:
        run_files("sequences.parquet", "greedy"),
    output:
        verdicts="results/verify/greedy.parquet",
        table=report("results/tables/greedy_identity.csv", caption="../report/greedy_identity.rst",
                     category="Verification"),
    conda:
        SPECDEC_ENV
    log:
        "logs/verify/greedy.log",
    script:
        "../scripts/verify_greedy.py"


# Distribution: above temperature 0, speculative samples must follow the target's exact distribution.
rule verify_distribution:
    input:
        unpack(draft_model_input),
        target=model_dir(config["target"]),
        prompts="results/prompts/{domain}.parquet",
    output:
        "results/verify/distribution/{draft}/{domain}.parquet",
    params:
        settings=DISTRIBUTION,
        draft_spec=lambda wc: draft_spec(wc.draft),
        runtime=RUNTIME,
    threads: workflow.cores
    resources:
        mem_mb=14000,
        gpu=1 if RUNTIME.get("device") == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        "logs/verify/distribution/{draft}/{domain}.log",
    benchmark:
        "benchmarks/verify/distribution/{draft}/{domain}.tsv"
    script:
        "../scripts/verify_distribution.py"


rule distribution_table:
    input:
        distribution_files(),
    output:
        report("results/tables/distribution.csv", caption="../report/distribution.rst", category="Verification"),
    params:
        alpha=(DISTRIBUTION or {}).get("alpha", 0.01),
    conda:
        SPECDEC_ENV
    log:
        "logs/verify/distribution_table.log",
    script:
        "../scripts/distribution_table.py"
