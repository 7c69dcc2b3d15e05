# Cost model: per-layer profiles of every model the study decodes with, the machine's read bandwidth, and the
# speedup the profiled costs predict from measured acceptance, audited against the measured speedup.


def profiled_models():
    """The target, every draft model of its own in the study and the draft sweep (early-exit drafts are read off
    the target's profile) and the profiling.extra_models, profiled only to give the fit more layer widths. A draft
    held in another dtype is not profiled as such: the audit prices it at its measured step."""
    names = [config["target"]]
    for name in [*config["drafts"], *sweep_drafts()]:
        spec = draft_spec(name)
        if spec["kind"] == "model":
            names.append(spec["model"])
        elif spec["kind"] in OWN_MODEL_KINDS:
            names.append(name)
    return list(dict.fromkeys(names + list(PROFILING.get("extra_models", []))))


rule profile_model:
    input:
        model_dir("{profiled}"),
    output:
        "results/profiles/{profiled}.parquet",
    params:
        profiling=PROFILING,
        positions=list(range(1, max(DECODING["k"]) + 2)),
        runtime=RUNTIME,
    threads: workflow.cores
    resources:
        mem_mb=10000,
        gpu=1 if RUNTIME.get("device") == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        "logs/profile/{profiled}.log",
    benchmark:
        "benchmarks/profile/{profiled}.tsv"
    script:
        "../scripts/profile_model.py"


rule measure_bandwidth:
    output:
        "results/profiles/bandwidth.json",
    params:
        repeats=PROFILING.get("repeats", 10),
    threads: workflow.cores
    conda:
        SPECDEC_ENV
    log:
        "logs/profile/bandwidth.log",
    script:
        "../scripts/measure_bandwidth.py"


rule costmodel:
    input:
        profiles=expand("results/profiles/{profiled}.parquet", profiled=profiled_models()),
        bandwidth="results/profiles/bandwidth.json",
        steps=run_files("steps.parquet", "greedy"),
        sequences=run_files("sequences.parquet", "greedy"),
        sweep_steps=sweep_run_files("steps.parquet"),
        sweep_sequences=sweep_run_files("sequences.parquet"),
    output:
        table=report("results/tables/costmodel.csv", caption="../report/costmodel.rst", category="Cost model"),
        terms="results/tables/costmodel_terms.csv",
        verify="results/tables/verify_cost.csv",
        timings="results/tables/step_timings.csv",
        roofline="results/tables/roofline.csv",
        verdict=report("results/tables/costmodel_verdict.md", caption="../report/costmodel_verdict.rst",
                       category="Cost model"),
        layer_plot=report("results/plots/layer_time_vs_width.png", caption="../report/layer_time_vs_width.rst",
                          category="Cost model"),
        audit_plot=report("results/plots/predicted_vs_measured.png", caption="../report/predicted_vs_measured.rst",
                          category="Cost model"),
        drafts=report("results/tables/drafts.csv", caption="../report/drafts.rst", category="Drafts"),
        best="results/tables/best_drafts.csv",
        drafts_plot=report("results/plots/drafts_vs_depth.png", caption="../report/drafts_vs_depth.rst",
                           category="Drafts"),
    params:
        target=config["target"],
        draft_specs={name: draft_spec(name) for name in config["drafts"]},
        sweep_specs={name: draft_spec(name) for name in sweep_drafts()},
        runtime_dtype=RUNTIME.get("dtype", "float32"),
        n_boot=PROFILING.get("n_boot", 1000),
        tolerance=PROFILING.get("audit_tolerance", 0.10),
    conda:
        SPECDEC_ENV
    log:
        "logs/report/costmodel.log",
    script:
        "../scripts/costmodel.py"


# Reproduce: rerun a subset of the greedy grid from scratch (fresh process, `reproduce.repeats` timing repeats) and
# check that acceptance and tokens per pass equal the first run's; report the spread of wall speedups.
REPRODUCE = config.get("reproduce") or {}


def reproduce_cells():
    return [(d, dom, k) for d in REPRODUCE.get("drafts", config["drafts"][:1])
            for dom in REPRODUCE.get("domains", list(config["domains"])[:1]) for k in REPRODUCE.get("k", [4])]


use rule decode as reproduce_decode with:
    output:
        steps="results/reproduce/runs/{setting}/{draft}/{domain}/k{k}/seed{seed}/steps.parquet",
        sequences="results/reproduce/runs/{setting}/{draft}/{domain}/k{k}/seed{seed}/sequences.parquet",
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        sampling=sampling_params,
        max_new_tokens=DECODING["max_new_tokens"],
        repeats=REPRODUCE.get("repeats", 3),
        runtime=RUNTIME,
        prompt_limit=REPRODUCE.get("prompts_per_domain"),
    log:
        "logs/reproduce/{setting}/{draft}/{domain}/k{k}/seed{seed}.log",
    benchmark:
        "benchmarks/reproduce/{setting}/{draft}/{domain}/k{k}/seed{seed}.tsv"


rule reproduce_table:
    input:
        first=[f"results/runs/greedy/{d}/{dom}/k{k}/seed0/sequences.parquet" for d, dom, k in reproduce_cells()],
        rerun=[f"results/reproduce/runs/greedy/{d}/{dom}/k{k}/seed0/sequences.parquet" for d, dom, k in reproduce_cells()],
    output:
        report("results/tables/reproduce.csv", caption="../report/reproduce.rst", category="Cost model"),
    conda:
        SPECDEC_ENV
    log:
        "logs/reproduce/reproduce_table.log",
    script:
        "../scripts/reproduce_table.py"


rule reproduce:
    input:
        "results/tables/reproduce.csv",
