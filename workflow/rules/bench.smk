# Bench stage: the bench/ measurements whose tables are committed, each as one rule running its script's own
# command line (bench/README.md lists every script; the settings as committed: specdec/study/bench.py). Not part of
# `rule all`:
#   snakemake --cores 2 bench                                   the study's (fp32): batch_invariance, draft_dtype_ab
#   snakemake --cores 2 --configfile config/gguf.yaml bench     the gguf regime's: batch_invariance, same_model,
#                                                               llamacpp_agreement (after the side-by-side runs)
# The experiments' tables are asked for by path under that experiment's results_dir:
#   snakemake --cores 2 --configfile config/heads.yaml experiments/feature-head/config.yaml \
#     -- results/experiments/feature-head/<machine>/tables/feature_head_cost.csv
#   snakemake --cores 2 --configfile config/gguf.yaml experiments/llamacpp-no-repack/config.yaml \
#     experiments/vs-llamacpp-amx/config.yaml -- results/experiments/vs-llamacpp-amx/<machine>/tables/kernel_ab_code.csv
# A committed table is up to date for Snakemake even where its inputs are not made yet: measure again with
# `--forcerun <rule>` (the timed ones alone on the machine).
import os

from specdec.study import bench as bench_plan

# bench/ beside the Snakefile, as a path from the working directory ("bench" in the checkout): the commands read as
# the scripts' docstrings give them, and moving the checkout changes no param
BENCH_SCRIPTS = os.path.relpath(f"{workflow.basedir}/bench")
BENCH_REGIME = bench_plan.regime(GGUF)
BENCH_PROMPTS = expand(f"{R}/prompts/{{domain}}.parquet", domain=list(config["domains"]))


def bench_only_in(wanted, what):
    """An input function refusing, as every plan refusal (workflow_error), a rule of regime `wanted` in the other."""
    return workflow_error(bench_plan.only_in(wanted, GGUF, what))


# The A/B rules' draft model, named by the config or refused as every plan refusal
bench_draft_model = workflow_error(bench_plan.draft_model)


# Logits of a one-token step against passes of m positions, per kernel (bench_plan.BATCH_INVARIANCE; not a timing).
rule bench_batch_invariance:
    input:
        model=target_input(),
        prompts=BENCH_PROMPTS,
    output:
        f"{R}/tables/batch_invariance.csv",
    params:
        script=f"{BENCH_SCRIPTS}/batch_invariance.py",
        weights="--gguf" if GGUF else "--model",
        kernels=["--kernels", *bench_plan.BATCH_INVARIANCE["fp32"]["kernels"]] if not GGUF else [],
        domains=list(config["domains"]),
        prompts_dir=lambda wildcards, input: os.path.dirname(input.prompts[0]),
        prompts=bench_plan.BATCH_INVARIANCE[BENCH_REGIME]["prompts"],
        tokens=bench_plan.BATCH_INVARIANCE[BENCH_REGIME]["tokens"],
        m=bench_plan.BATCH_INVARIANCE[BENCH_REGIME]["m"],
        threads=THREADS,
    threads: THREADS
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/bench/batch_invariance.log",
    shell:
        "python {params.script} {params.weights} {input.model} {params.kernels} --domains {params.domains} "
        "--prompts-dir {params.prompts_dir} --prompts {params.prompts} --tokens {params.tokens} --m {params.m} "
        "--threads {params.threads} --out {output} > {log} 2>&1"


# fp32: the 0.5B draft in float32 and in bfloat16, baseline and speculative interleaved, 3 code prompts, k 4 and 8.
rule bench_draft_dtype_ab:
    input:
        unpack(bench_only_in("fp32", "bench_draft_dtype_ab (the draft's fp32 and bf16 copies)")),
        target=model_dir(config["target"]),
        draft=lambda wildcards: model_dir(bench_draft_model(config["models"])),
        prompts=f"{R}/prompts/code.parquet",
    output:
        table=f"{R}/tables/draft_dtype_ab.csv",
        runs=f"{R}/tables/draft_dtype_ab.runs.csv",
    params:
        script=f"{BENCH_SCRIPTS}/draft_ab.py",
        prompts_count=3,
        k=[4, 8],
        variants=["float32", "bfloat16"],
        threads=THREADS,
    threads: THREADS
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/bench/draft_dtype_ab.log",
    benchmark:
        f"{BENCH}/bench/draft_dtype_ab.tsv"
    shell:
        "python {params.script} --target {input.target} --draft {input.draft} --prompts {input.prompts} "
        "--count {params.prompts_count} --k {params.k} --variants {params.variants} --threads {params.threads} "
        "--out {output.table} > {log} 2>&1"


# gguf: the quantized engine against the fp32 engine on the same file's dequantised weights (next-token agreement and
# KL over 32 teacher-forced positions, 5 prompts per domain; not a timing).
rule bench_same_model:
    input:
        unpack(bench_only_in("gguf", "bench_same_model (the GGUF engine against the fp32 one)")),
        fp32=model_dir(config["target"]),
        gguf=gguf_file(config["target"]),
        prompts=BENCH_PROMPTS,
    output:
        f"{R}/tables/same_model.csv",
    params:
        script=f"{BENCH_SCRIPTS}/same_model.py",
        model=config["target"],
        domains=list(config["domains"]),
        prompts_dir=lambda wildcards, input: os.path.dirname(input.prompts[0]),
        prompts=5,
        tokens=32,
        threads=THREADS,
    threads: THREADS
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/bench/same_model.log",
    shell:
        "python {params.script} --model {params.model} --domains {params.domains} "
        "--prompts-dir {params.prompts_dir} --prompts {params.prompts} --tokens {params.tokens} "
        "--threads {params.threads} --out {output} > {log} 2>&1"


# gguf: our greedy text against llama.cpp's on the same file, from the side-by-side job's plain runs (vs_llamacpp).
rule bench_llamacpp_agreement:
    input:
        unpack(bench_only_in("gguf", "bench_llamacpp_agreement (our text against llama.cpp's)")),
        runs=expand(f"{R}/vs_llamacpp/runs/{{domain}}.parquet", domain=list(config["domains"])),
        tokenizer=expand(rules.gguf_tokenizer.output[0], model=config["target"]),
    output:
        f"{R}/tables/llamacpp_agreement.csv",
    params:
        script=f"{BENCH_SCRIPTS}/llamacpp_agreement.py",
        runs_dir=lambda wildcards, input: os.path.dirname(input.runs[0]),
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/bench/llamacpp_agreement.log",
    shell:
        "python {params.script} --runs {params.runs_dir} --tokenizer {input.tokenizer} --out {output} > {log} 2>&1"


# experiments/feature-head (an fp32 layer): an untrained head's draft step against the target's step, in both
# regimes in one process (the target's directory and its GGUF file); the script's defaults (vocabularies 32768 and
# 8192, fp32 and bf16 heads, 30 rounds). A timing.
rule bench_feature_head_cost:
    input:
        unpack(bench_only_in("fp32", "bench_feature_head_cost (the fp32 target beside its GGUF file)")),
        fp32=model_dir(config["target"]),
        gguf=gguf_file(config["target"]),
    output:
        f"{R}/tables/feature_head_cost.csv",
    params:
        script=f"{BENCH_SCRIPTS}/feature_head_cost.py",
        model=config["target"],
        threads=THREADS,
    threads: THREADS
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/bench/feature_head_cost.log",
    benchmark:
        f"{BENCH}/bench/feature_head_cost.tsv"
    shell:
        "python {params.script} --model {params.model} --threads {params.threads} --out {output} > {log} 2>&1"


# experiments/vs-llamacpp-amx (a gguf layer): plain and speculative decoding per product kernel, interleaved per
# prompt, one domain a job (bench_plan.KERNEL_AB). A timing; the script writes its runs and provenance beside it.
rule bench_kernel_ab:
    input:
        unpack(bench_only_in("gguf", "bench_kernel_ab (the GGUF pair under each product kernel)")),
        target=gguf_file(config["target"]),
        draft=lambda wildcards: gguf_file(bench_draft_model(config["models"])),
        prompts=f"{R}/prompts/{{domain}}.parquet",
    output:
        table=f"{R}/tables/kernel_ab_{{domain}}.csv",
        runs=f"{R}/tables/kernel_ab_{{domain}}.runs.csv",
        provenance=f"{R}/tables/kernel_ab_{{domain}}.provenance.yaml",
    params:
        script=f"{BENCH_SCRIPTS}/kernel_ab.py",
        prompts_count=lambda wildcards: bench_plan.kernel_ab_setting("prompts", wildcards.domain),
        drafts=lambda wildcards: bench_plan.kernel_ab_setting("drafts", wildcards.domain),
        kernels=bench_plan.KERNEL_AB["kernels"],
        max_new_tokens=bench_plan.KERNEL_AB["max_new_tokens"],
        threads=THREADS,
    threads: THREADS
    resources:
        mem_mb=8000,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/bench/kernel_ab_{{domain}}.log",
    benchmark:
        f"{BENCH}/bench/kernel_ab_{{domain}}.tsv"
    shell:
        "python {params.script} --target {input.target} --draft {input.draft} --prompts {input.prompts} "
        "--count {params.prompts_count} --kernels {params.kernels} --drafts {params.drafts} "
        "--max-new-tokens {params.max_new_tokens} --threads {params.threads} --out {output.table} > {log} 2>&1"


# `snakemake --cores 2 bench`: the committed bench tables of this run's regime (bench_plan.STUDY_TABLES).
rule bench:
    input:
        bench_plan.study_tables(R, GGUF),
