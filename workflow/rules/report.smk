# Final tables, plots and provenance of the study.


rule study_table:
    input:
        run_files("sequences.parquet"),
    output:
        csv=report(f"{R}/tables/study.csv", caption="../report/study.rst", category="Study"),
        md=f"{R}/tables/study.md",
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/study_table.log",
    script:
        "../scripts/study_table.py"


rule plots:
    input:
        f"{R}/tables/study.csv",
    output:
        heatmap=report(f"{R}/plots/acceptance_heatmap.png", caption="../report/acceptance_heatmap.rst",
                       category="Study"),
        speedup=report(f"{R}/plots/speedup_vs_k.png", caption="../report/speedup_vs_k.rst", category="Study"),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/plots.log",
    script:
        "../scripts/plots.py"


rule provenance:
    input:
        tables=[f"{R}/tables/study.csv", f"{R}/tables/greedy_identity.csv"],
        models=study_model_dirs(),
        benchmarks=[f"{BENCH}/decode/{s}/{d}/{dom}/k{k}/seed{seed}.tsv" for s, d, dom, k, seed in decode_jobs()],
        kernels=study_kernel_tables(),
    output:
        f"{R}/provenance.yaml",
    params:
        config=config,
        threads=THREADS,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/provenance.log",
    script:
        "../scripts/provenance.py"
