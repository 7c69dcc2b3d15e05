# Cost model: per-layer profiles of every model the study decodes with and the machine's read bandwidth, kept per
# machine (results/machines/{machine}/{linear_kernel}/); the fit, its verdict on depth vs bytes and the audit of the
# predicted speedup against the decode runs; one verdict across every machine measured so far.


rule time_linear_backends:
    input:
        unpack(fp32_only("time_linear_backends (the fp32/bf16 kernel tables)")),
        model_dir("{profiled}"),
    output:
        kernel_table("{profiled}"),
    params:
        dtype="float32",
        rows=list(range(1, PROFILING.get("kernel_rows", 9) + 1)),
        repeats=PROFILING.get("kernel_repeats", 3),
    threads: THREADS
    resources:
        mem_mb=10000,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/profile/kernels_{{profiled}}.log",
    script:
        "../scripts/time_linear_backends.py"


# The same for a model held in bf16 (a bf16 or hybrid draft): torch's bf16 product, the AVX2 kernel on the bf16
# weights and the fp32 copy, at the row counts a bf16 draft's steps and catch-ups use (kernels.BF16_TUNED_ROWS).
use rule time_linear_backends as time_bf16_products with:
    output:
        kernel_table("{profiled}", "bfloat16"),
    params:
        dtype="bfloat16",
        rows=[1, 2, 4, 8, 16, 32],
        repeats=2,
    log:
        f"{LOG}/profile/kernels_{{profiled}}.bfloat16.log",


# The fit's models (the target and the study's drafts' models) are profiled in one job, interleaved repeat by
# repeat, so that a drift of the shared machine lands on every width alike (the fit compares layers across models);
# any other model a draft names (a truncated cut) gets a profile of its own from profile_model.
ruleorder: profile_fit_models > profile_model
FIT_MODELS = profiled_models(config["drafts"])


rule profile_fit_models:
    input:
        # prepared model directories, or in the gguf regime GGUF files (each read once: a cut shares its file);
        # none with profiling.weights random (random weights of each model's architecture)
        models=[source for source in (profiled_source(name)[0] for name in FIT_MODELS) if source],
        kernels=[kernel_table(name, RUNTIME["dtype"]) for name in FIT_MODELS]
        if RUNTIME["linear_kernel"] in TIMED_KERNELS and not GGUF and not PLAN.random_weights else [],
    output:
        # the fit's models' profiles, then the feature heads' draft steps' (priced beside the target they draft for)
        [*profile_files(config["drafts"]), *head_profile_files()],
    params:
        names=FIT_MODELS,
        target=config["target"],
        heads=head_profiles(),
        layers=[profiled_source(name)[1] for name in FIT_MODELS],
        architectures=PLAN.random_architectures(FIT_MODELS),
        profiling=PROFILING,
        positions=list(range(1, max(DECODING["k"]) + 2)),
        runtime=RUNTIME,
    threads: THREADS
    resources:
        mem_mb=(3000 if GGUF else 10000) * len(FIT_MODELS),
        gpu=1 if RUNTIME["device"] == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/profile/fit_models.log",
    benchmark:
        f"{BENCH}/profile/fit_models.tsv"
    script:
        "../scripts/profile_model.py"


rule profile_model:
    input:
        unpack(profiled_kernel_input),
        models=lambda wildcards: profiled_source(wildcards.profiled)[0] or [],
    output:
        f"{MACHINE_DIR}/profiles/{{profiled}}.csv",
    params:
        layers=lambda wildcards: [profiled_source(wildcards.profiled)[1]],
        architectures=lambda wildcards: PLAN.random_architectures([wildcards.profiled]),
        profiling=PROFILING,
        positions=list(range(1, max(DECODING["k"]) + 2)),
        runtime=RUNTIME,
    threads: THREADS
    resources:
        mem_mb=10000,
        gpu=1 if RUNTIME["device"] == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/profile/{{profiled}}.log",
    benchmark:
        f"{BENCH}/profile/{{profiled}}.tsv"
    script:
        "../scripts/profile_model.py"


rule measure_bandwidth:
    output:
        f"{MACHINE_DIR}/bandwidth.json",
    params:
        repeats=PROFILING.get("repeats", 10),
        machine=MACHINE,
    threads: THREADS
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/profile/bandwidth.log",
    script:
        "../scripts/measure_bandwidth.py"


# The fit alone, from the profiles (no decode run): what adding a machine to the verdict takes.
rule machine_fit:
    input:
        # the fit: the study's models, the same set on every machine so that fits compare
        profiles=profile_files(config["drafts"]),
        # any other model this machine has a profile of (e.g. a truncated draft's): its c measured, not the fit
        others=sorted(set(glob.glob(f"{MACHINE_DIR}/profiles/*.csv")) - set(profile_files(config["drafts"]))
                      - set(head_profile_files())),
        heads=head_profile_files(),
    output:
        terms=f"{MACHINE_DIR}/costmodel_terms.csv",
        verify=f"{MACHINE_DIR}/verify_cost.csv",
        shapes=f"{MACHINE_DIR}/shapes.csv",
        drafts=f"{MACHINE_DIR}/fitted_drafts_c.csv",
    params:
        target=config["target"],
        draft_specs={name: draft_spec(name) for name in machine_fit_drafts()},
        plugins=PLUGINS,
        runtime_dtype=RUNTIME["dtype"],
        n_boot=PROFILING.get("n_boot", 1000),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/profile/machine_fit.log",
    script:
        "../scripts/machine_fit.py"


rule costmodel:
    input:
        profiles=profile_files(config["drafts"]),
        bandwidth=f"{MACHINE_DIR}/bandwidth.json",
        steps=run_files("steps.parquet", "greedy"),
        sequences=run_files("sequences.parquet", "greedy"),
    output:
        table=report(f"{R}/tables/costmodel.csv", caption="../report/costmodel.rst", category="Cost model"),
        terms=f"{R}/tables/costmodel_terms.csv",
        verify=f"{R}/tables/verify_cost.csv",
        timings=f"{R}/tables/step_timings.csv",
        roofline=f"{R}/tables/roofline.csv",
        verdict=report(f"{R}/tables/costmodel_verdict.md", caption="../report/costmodel_verdict.rst",
                       category="Cost model"),
        layer_plot=report(f"{R}/plots/layer_time_vs_width.png", caption="../report/layer_time_vs_width.rst",
                          category="Cost model"),
        audit_plot=report(f"{R}/plots/predicted_vs_measured.png", caption="../report/predicted_vs_measured.rst",
                          category="Cost model"),
        machine_drafts=f"{MACHINE_DIR}/drafts_c.csv",
    params:
        target=config["target"],
        draft_specs={name: draft_spec(name) for name in config["drafts"]},
        plugins=PLUGINS,
        runtime_dtype=RUNTIME["dtype"],
        n_boot=PROFILING.get("n_boot", 1000),
        tolerance=PROFILING.get("audit_tolerance", 0.10),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/costmodel.log",
    script:
        "../scripts/costmodel.py"


rule machines:
    input:
        current=machine_fit_files(),
        fits=[f"{d}/costmodel_terms.csv" for d in measured_machine_dirs()],
    output:
        table=report(f"{R}/tables/machines.csv", caption="../report/machines.rst", category="Cost model"),
        drafts=f"{R}/tables/machines_drafts.csv",
        verdict=f"{R}/tables/machines_verdict.md",
        plot=report(f"{R}/plots/machines.png", caption="../report/machines.rst", category="Cost model"),
    params:
        target=config["target"],
        reported=config.get("reported_machines") or {},
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/report/machines.log",
    script:
        "../scripts/machines.py"


# `snakemake --cores 2 machine`: this machine's profiles and fit, then the verdict across machines. A named target
# because results/study/tables/machines.csv is committed: asked for by name, Snakemake keeps an existing output whose
# inputs are missing (it takes them for deleted temporary files) and would not fit a new machine.
rule machine:
    input:
        machine_fit_files(),
        f"{R}/tables/machines.csv",


# `snakemake --cores 2 roofline`: the target's step and verify passes against the bandwidth floor, for each linear
# backend this machine has and for the per-machine choice (docs/performance.md).
rule roofline_kernels:
    input:
        unpack(fp32_only("roofline_kernels (the fp32 linear backends against the bandwidth floor)")),
        target=model_dir(config["target"]),
        bandwidth=f"{MACHINE_DIR}/bandwidth.json",
        kernels=kernel_table(config["target"]),
    output:
        report(f"{R}/tables/roofline_kernels.csv", caption="../report/roofline_kernels.rst", category="Performance"),
    params:
        positions=list(range(1, 10)),
        repeats=PROFILING.get("repeats", 10),
        context_length=PROFILING.get("context_length", 256),
    threads: THREADS
    resources:
        mem_mb=10000,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/profile/roofline_kernels.log",
    script:
        "../scripts/roofline.py"


rule roofline:
    input:
        f"{R}/tables/roofline_kernels.csv",
