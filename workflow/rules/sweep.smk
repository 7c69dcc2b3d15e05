# The draft sweep (`snakemake --cores 2 sweep`; docs/drafts.md): greedy runs of every draft in draft_sweep.drafts on
# every domain, all of draft_sweep.k in one process per (draft, domain) with a single baseline timed next to them,
# over the first draft_sweep.prompts_per_domain prompts (per_draft may narrow both for single drafts). drafts.csv
# joins its cells with the study's; sweep_cells.csv (`snakemake {results_dir}/tables/sweep_cells.csv`) gives them
# as measured, without the cost model and its profiles.


use rule decode as sweep_decode with:
    output:
        # every k of the sweep from one job; the other wildcards stay wildcards ({{{{...}}}}: escaped for f and expand)
        steps=expand(f"{R}/sweep/runs/{{{{setting}}}}/{{{{draft}}}}/{{{{domain}}}}/k{{k}}/seed{{{{seed}}}}/steps.parquet",
                     k=SWEEP_K),
        sequences=expand(f"{R}/sweep/runs/{{{{setting}}}}/{{{{draft}}}}/{{{{domain}}}}/k{{k}}/seed{{{{seed}}}}/sequences.parquet",
                         k=SWEEP_K),
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        plugins=PLUGINS,
        sampling=sampling_params,
        max_new_tokens=DECODING["max_new_tokens"],
        repeats=SWEEP.get("repeats", 1),
        runtime=RUNTIME,
        prompt_limit=lambda wc: sweep_setting(wc.draft, "prompts_per_domain", None),
        ks=SWEEP_K,
    log:
        f"{LOG}/sweep/{{setting}}/{{draft}}/{{domain}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/sweep/{{setting}}/{{draft}}/{{domain}}/seed{{seed}}.tsv"


rule sweep_cells:
    input:
        steps=sweep_run_files("steps.parquet"),
        sequences=sweep_run_files("sequences.parquet"),
        models=sweep_model_files(),
        benchmarks=sweep_benchmark_files(),
    output:
        csv=f"{R}/tables/sweep_cells.csv",
        md=f"{R}/tables/sweep_cells.md",
        provenance=f"{R}/tables/sweep_cells.provenance.yaml",
    params:
        config=config,
        threads=THREADS,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/sweep_cells.log",
    script:
        "../scripts/sweep_cells.py"


rule drafts_table:
    input:
        costmodel=f"{R}/tables/costmodel.csv",
        profiles=profile_files([*config["drafts"], *sweep_drafts()]),
        sweep_steps=sweep_run_files("steps.parquet"),
        sweep_sequences=sweep_run_files("sequences.parquet"),
    output:
        drafts=report(f"{R}/tables/drafts.csv", caption="../report/drafts.rst", category="Drafts"),
        best=f"{R}/tables/best_drafts.csv",
        plot=report(f"{R}/plots/drafts_vs_depth.png", caption="../report/drafts_vs_depth.rst", category="Drafts"),
        machine_drafts=f"{MACHINE_DIR}/sweep_drafts_c.csv",
        machine_cells=f"{MACHINE_DIR}/drafts.csv",
    params:
        target=config["target"],
        draft_specs={name: draft_spec(name) for name in dict.fromkeys([*config["drafts"], *sweep_drafts()])},
        plugins=PLUGINS,
        runtime_dtype=RUNTIME["dtype"],
        n_boot=PROFILING.get("n_boot", 1000),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/drafts_table.log",
    script:
        "../scripts/drafts_table.py"


rule best_drafts_by_machine:
    input:
        current=f"{MACHINE_DIR}/drafts.csv",
        others=[f"{d}/drafts.csv" for d in measured_machine_dirs() if os.path.exists(f"{d}/drafts.csv")],
        # every machine's fit predicts every cell, measured there or not (its tokens per pass are the machine's too)
        fits=[f"{d}/costmodel_terms.csv" for d in [MACHINE_DIR, *measured_machine_dirs()]],
    output:
        f"{R}/tables/best_drafts_by_machine.csv",
    params:
        target=config["target"],
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/best_drafts_by_machine.log",
    script:
        "../scripts/best_drafts_by_machine.py"


rule sweep:
    input:
        sweep_run_files("sequences.parquet"),
        f"{R}/tables/drafts.csv",
        f"{R}/tables/best_drafts_by_machine.csv",
