# Feature-level draft heads (draft kind feature_head, docs/feature-head.md): one decoder layer over the target's own
# features, trained on the distillation stage's sequences (training prompts, none of the evaluation prompts, each
# with the target's greedy continuation) and the target's features there, computed once. Named target:
# `snakemake train_feature_heads`; a decode job of a feature-head draft trains it first if its directory is missing.

FEATURE_HEADS = drafts_made_by("train_feature_head")


wildcard_constraints:
    head=one_of(FEATURE_HEADS, "no-feature-head"),


def feature_head_training(wildcards):
    """The head's settings: its draft's `training` and `vocab` fields over the defaults (FeatureHeadSettings)."""
    spec = config["draft_kinds"][wildcards.head]
    return {**spec.get("training", {}), **({"vocab": spec["vocab"]} if "vocab" in spec else {})}


rule feature_head_features:
    input:
        unpack(fp32_only("feature_head_features (the feature heads' training data)")),
        unpack(kernel_inputs),
        target=model_dir(config["target"]),
        teacher="resources/distill/teacher",
    output:
        directory("resources/feature_head/features"),
    params:
        runtime=RUNTIME,
    threads: THREADS
    resources:
        mem_mb=12000,
    conda:
        SPECDEC_ENV
    log:
        "logs/feature_head/features.log",
    benchmark:
        "benchmarks/feature_head/features.tsv"
    script:
        "../scripts/feature_head_features.py"


rule train_feature_head:
    input:
        target=model_dir(config["target"]),
        teacher="resources/distill/teacher",
        features="resources/feature_head/features",
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
