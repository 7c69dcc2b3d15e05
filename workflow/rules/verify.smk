# Verification: greedy speculative output must equal greedy baseline output, token for token; above temperature 0
# the output must be distributed as the target's.


rule verify_greedy:
    input:
        run_files("sequences.parquet", "greedy"),
    output:
        verdicts=f"{R}/verify/greedy.parquet",
        table=report(f"{R}/tables/greedy_identity.csv", caption="../report/greedy_identity.rst",
                     category="Verification"),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/verify/greedy.log",
    script:
        "../scripts/verify_greedy.py"


rule verify_distribution:
    input:
        unpack(draft_model_input),
        unpack(kernel_inputs),
        target=target_input(),  # a model directory, or with runtime.weights gguf the target's GGUF file
        prompts=f"{R}/prompts/{{domain}}.parquet",
    output:
        f"{R}/verify/distribution/{{draft}}/{{domain}}.parquet",
    params:
        settings=DISTRIBUTION,
        draft_spec=lambda wc: draft_spec(wc.draft),
        # the number of (draft, domain) jobs: the family the Bonferroni threshold, and so each test's N, is sized for
        n_jobs=len(distribution_files()),
        plugins=PLUGINS,
        runtime=RUNTIME,
    threads: THREADS
    resources:
        mem_mb=14000,
        gpu=1 if RUNTIME["device"] == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/verify/distribution/{{draft}}/{{domain}}.log",
    benchmark:
        f"{BENCH}/verify/distribution/{{draft}}/{{domain}}.tsv"
    script:
        "../scripts/verify_distribution.py"


rule distribution_table:
    input:
        distribution_files(),
    output:
        report(f"{R}/tables/distribution.csv", caption="../report/distribution.rst", category="Verification"),
    params:
        settings=DISTRIBUTION,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/verify/distribution_table.log",
    script:
        "../scripts/distribution_table.py"
