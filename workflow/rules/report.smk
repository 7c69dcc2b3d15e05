# Final tables, plots and provenance.


rule study_table:
    input:
        run_files("sequences.parquet"),
    output:
        csv=report("results/tables/study.csv", caption="../report/study.rst", category="Study"),
        md="results/tables/study.md",
    conda:
        SPECDEC_ENV
    log:
        "logs/report/study_table.log",
    script:
        "../scripts/study_table.py"


rule plots:
    input:
        "results/tables/study.csv",
    output:
        heatmap=report("results/plots/acceptance_heatmap.png", caption="../report/acceptance_heatmap.rst",
                       category="Study"),
        speedup=report("results/plots/speedup_vs_k.png", caption="../report/speedup_vs_k.rst", category="Study"),
    conda:
        SPECDEC_ENV
    log:
        "logs/report/plots.log",
    script:
        "../scripts/plots.py"


rule provenance:
    input:
        tables=["results/tables/study.csv", "results/tables/greedy_identity.csv"],
        models=study_model_dirs(),
        benchmarks=[f"benchmarks/decode/{s}/{d}/{dom}/k{k}/seed{seed}.tsv" for s, d, dom, k, seed in decode_jobs()],
    output:
        "results/provenance.yaml",
    params:
        config=config,
    conda:
        SPECDEC_ENV
    log:
        "logs/report/provenance.log",
    script:
        "../scripts/provenance.py"
