# Feature-level draft heads (draft kind feature_head, docs/feature-head.md): one decoder layer over the target's own
# features, trained on the target's greedy answers to training prompts (none of the evaluation prompts) and its
# features there, kept while generating them (feature_head.data in config.yaml). Named target:
# `snakemake train_feature_heads`; a decode job of a feature-head draft trains it first if its directory is missing.

FEATURE_HEADS = drafts_made_by("train_feature_head")
HEAD_DATA = (config.get("feature_head") or {}).get("data") or {}
HEAD_DOMAINS = HEAD_DATA.get("domains") or TRAINING_DOMAINS
HEAD_ENGINE = HEAD_DATA.get("engine", "gguf")


wildcard_constraints:
    head=one_of(FEATURE_HEADS, "no-feature-head"),


def feature_head_training(wildcards):
    """The head's settings: its draft's `training` and `vocab` fields over the defaults (FeatureHeadSettings)."""
    spec = config["draft_kinds"][wildcards.head]
    return {**spec.get("training", {}), **({"vocab": spec["vocab"]} if "vocab" in spec else {})}


def feature_head_data_inputs(wildcards):
    """The target as the data stage runs it: its GGUF file (engine gguf), or its prepared model and kernel tables."""
    if HEAD_ENGINE == "gguf":
        return {"target": gguf_file(config["target"])}
    return {"target": model_dir(config["target"]), **kernel_inputs(wildcards)}


def head_data_runtime():
    """The runtime the data stage runs the target on (feature_head_data.py takes it as is): its engine's, the same
    in both regimes, so that decoding the heads in the GGUF regime does not make their data again."""
    if HEAD_ENGINE == "gguf":
        return {**RUNTIME, "weights": "gguf", "dtype": "float32"}
    return {**RUNTIME, "weights": "safetensors"}


# The heads' data live under resources/, shared by every results directory and both regimes (a layer with its own
# results_dir, or config/gguf.yaml, decodes the same heads): so nothing here depends on them. The evaluation's prompts
# are excluded by recomputing their selection from the config, and the tokenizer is the data engine's.
rule feature_head_prompts:
    input:
        unpack(lambda wc: training_prompt_inputs(HEAD_DOMAINS)),
        tokenizer=ancient(
            gguf_tokenizer_dir(config["target"]) if HEAD_ENGINE == "gguf" else model_dir(config["target"])
        ),
    output:
        "resources/feature_head/prompts.parquet",
    params:
        domains=HEAD_DOMAINS,
        prompt_sources=training_prompt_sources(HEAD_DOMAINS),
        evaluation=EVALUATION_SELECTION,
        per_domain=HEAD_DATA.get("prompts_per_domain", 8),
        seed=HEAD_DATA.get("seed", 2),
        max_prompt_tokens=config["prompts"]["max_prompt_tokens"],
        use_chat_template=config["prompts"]["use_chat_template"],
    conda:
        SPECDEC_ENV
    log:
        "logs/feature_head/training_prompts.log",
    script:
        "../scripts/make_training_prompts.py"


rule feature_head_data:
    input:
        unpack(feature_head_data_inputs),
        prompts="resources/feature_head/prompts.parquet",
    output:
        directory("resources/feature_head/data"),
    params:
        engine=HEAD_ENGINE,
        new_tokens=HEAD_DATA.get("new_tokens", 64),
        runtime=head_data_runtime(),
        parts="resources/feature_head/data_parts",
    threads: THREADS
    resources:
        mem_mb=8000,
    conda:
        SPECDEC_ENV
    log:
        "logs/feature_head/data.log",
    benchmark:
        "benchmarks/feature_head/data.tsv"
    script:
        "../scripts/feature_head_data.py"


rule train_feature_head:
    input:
        target=model_dir(config["target"]),
        data="resources/feature_head/data",
    output:
        model=directory("resources/models/{head}"),
        loss="results/feature_head/{head}/loss.csv",
        plot=report("results/plots/feature_head_{head}.png", caption="../report/feature_head.rst",
                    category="Drafts"),
    params:
        settings=feature_head_training,
        checkpoints=lambda wc: f"resources/feature_head/{wc.head}/checkpoints",
    threads: THREADS
    resources:
        mem_mb=12000,
    conda:
        SPECDEC_ENV
    log:
        "logs/feature_head/{head}.log",
    benchmark:
        "benchmarks/feature_head/{head}.tsv"
    script:
        "../scripts/train_feature_head.py"


rule train_feature_heads:
    input:
        [model_dir(head) for head in FEATURE_HEADS],
