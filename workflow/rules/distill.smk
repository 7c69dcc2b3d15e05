# Distilled drafts: a truncated model trained to match the target's next-token distributions on the target's own
# continuations of a training prompt set disjoint from the evaluation prompts. Run when a distilled draft is decoded
# (usually by the draft sweep).


rule make_training_prompts:
    input:
        unpack(fp32_only("make_training_prompts (distillation)")),
        unpack(lambda wc: training_prompt_inputs(TRAINING_DOMAINS)),
        tokenizer=model_dir(config["target"]),
    output:
        f"{R}/prompts/train.parquet",
    params:
        domains=TRAINING_DOMAINS,
        prompt_sources=training_prompt_sources(TRAINING_DOMAINS),
        evaluation=EVALUATION_SELECTION,
        per_domain=DISTILLATION.get("prompts_per_domain", 8),
        seed=DISTILLATION.get("seed", 1),
        max_prompt_tokens=config["prompts"]["max_prompt_tokens"],
        use_chat_template=config["prompts"]["use_chat_template"],
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/distill/training_prompts.log",
    script:
        "../scripts/make_training_prompts.py"


rule distill_data:
    input:
        unpack(fp32_only("distill_data (distillation's teacher)")),
        unpack(kernel_inputs),
        target=model_dir(config["target"]),
        prompts=f"{R}/prompts/train.parquet",
    output:
        directory("resources/distill/teacher"),
    params:
        new_tokens=DISTILLATION.get("new_tokens", 64),
        top_k=DISTILLATION.get("top_k", 64),
        runtime=RUNTIME,
    threads: THREADS
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
        lambda wc: model_dir(draft_spec(wc.distilled)["model"]),
    output:
        directory("resources/distill/{distilled}/init"),
    params:
        layers=lambda wc: draft_spec(wc.distilled)["layers"],
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
        loss="results/study/distill/{distilled}/loss.csv",
        plot=report("results/study/plots/distill_{distilled}.png", caption="../report/distill.rst", category="Drafts"),
    params:
        settings=distill_training,
        checkpoints=lambda wc: f"resources/distill/{wc.distilled}/checkpoints",
    threads: THREADS
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
