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
