# Distilled drafts: a truncated model trained to match the target's next-token distributions on the target's own
# continuations of a training prompt set disjoint from the evaluation prompts.

DISTILLATION = config.get("distillation") or {}
# Where training prompts come from (default: the evaluation domains' sources, minus the evaluation prompts).
TRAINING_DOMAINS = DISTILLATION.get("domains") or config["domains"]


rule make_training_prompts:
    input:
        unpack(lambda wc: {s: f"resources/prompt_sources/{source_file_name(s, config['prompt_sources'][s])}"
                           for d in TRAINING_DOMAINS.values() for s in domain_source_sets(d)}),
        evaluation=expand("results/prompts/{domain}.parquet", domain=list(config["domains"])),
        tokenizer=model_dir(config["target"]),
    output:
        "results/prompts/train.parquet",
    params:
        domains=TRAINING_DOMAINS,
        prompt_sources=config["prompt_sources"],
        per_domain=DISTILLATION.get("prompts_per_domain", 8),
        seed=DISTILLATION.get("seed", 1),
        max_prompt_tokens=config["prompts"].get("max_prompt_tokens", 1024),
        use_chat_template=config["prompts"].get("use_chat_template", True),
    conda:
        SPECDEC_ENV
    log:
        "logs/distill/training_prompts.log",
    script:
        "../scripts/make_training_prompts.py"


rule distill_data:
    input:
        target=model_dir(config["target"]),
        prompts="results/prompts/train.parquet",
    output:
        directory("resources/distill/teacher"),
    params:
        new_tokens=DISTILLATION.get("new_tokens", 64),
        top_k=DISTILLATION.get("top_k", 64),
        runtime=RUNTIME,
    threads: workflow.cores
    resources:
        mem_mb=12000,
    conda:
        SPECDEC_ENV
    log:
        "logs/distill/teacher.log",
    benchmark:
        "benchmarks/distill/teacher.tsv"
    script:
        "../scripts/distill_data.py"


rule derive_distill_init:
    input:
        lambda wc: model_dir(config["draft_kinds"][wc.distilled]["model"]),
    output:
        directory("resources/distill/{distilled}/init"),
    params:
        layers=lambda wc: config["draft_kinds"][wc.distilled]["layers"],
    conda:
        SPECDEC_ENV
    log:
        "logs/distill/{distilled}_init.log",
    script:
        "../scripts/derive_truncated_draft.py"


rule distill_draft:
    input:
        init="resources/distill/{distilled}/init",
        teacher="resources/distill/teacher",
    output:
        model=directory("resources/models/{distilled}"),
        loss="results/distill/{distilled}/loss.csv",
        plot=report("results/plots/distill_{distilled}.png", caption="../report/distill.rst", category="Drafts"),
    params:
        settings=lambda wc: {**{k: v for k, v in DISTILLATION.get("training", {}).items()},
                             **config["draft_kinds"][wc.distilled].get("training", {})},
        checkpoints=lambda wc: f"resources/distill/{wc.distilled}/checkpoints",
    threads: workflow.cores
    resources:
        mem_mb=12000,
    conda:
        SPECDEC_ENV
    log:
        "logs/distill/{distilled}.log",
    benchmark:
        "benchmarks/distill/{distilled}.tsv"
    script:
        "../scripts/distill_draft.py"
