# Feature-level draft heads (draft kind feature_head, docs/feature-head.md): one decoder layer over the target's own
# features, trained on the target's greedy answers to training prompts (none of the evaluation prompts) and its
# features there, kept while generating them (feature_head.data in config/heads.yaml). Named target:
# `snakemake train_feature_heads`; a decode job of a feature-head draft trains it first if its directory is missing.
# Its training curves go to the feature-head experiment (results/experiments/feature-head/), whatever results_dir:
# a head is trained once for every layer that decodes it. Without feature_head in the config the heads' data default
# to the distillation's domains (schema defaults).

FEATURE_HEADS = drafts_made_by("train_feature_head")
HEAD_DATA = (config.get("feature_head") or {}).get("data") or {}
HEAD_DOMAINS = HEAD_DATA.get("domains") or TRAINING_DOMAINS
HEAD_ENGINE = HEAD_DATA.get("engine", "gguf")


wildcard_constraints:
    head=one_of(FEATURE_HEADS, "no-feature-head"),


def feature_head_training(wildcards):
    """The head's settings: its draft's `training` and `vocab` fields over the defaults (FeatureHeadSettings). A head
    trained from another (`training.init`) keeps that head's drafting vocabulary: its `vocab` only prices it (the
    training job checks that the two agree)."""
    spec = config["draft_kinds"][wildcards.head]
    training = spec.get("training", {})
    own_vocab = "vocab" in spec and not training.get("init")
    return {**training, **({"vocab": spec["vocab"]} if own_vocab else {})}


# Where each `training.data` name of a head lives: the target's answers, the text it reads (feature_head.corpus).
HEAD_CORPUS = (config.get("feature_head") or {}).get("corpus")
# *_layers: the same text read again with the outputs of feature_head.fused_layers kept beside the features.
HEAD_DATA_DIRS = {"answers": "resources/feature_head/data", "corpus": "resources/feature_head/corpus_data",
                  "answers_layers": "resources/feature_head/answers_layers",
                  "corpus_layers": "resources/feature_head/corpus_layers"}
HEAD_FUSED_LAYERS = (config.get("feature_head") or {}).get("fused_layers") or []


def head_training_inputs(wildcards):
    """A head's inputs: the target, the data its `training.data` names (default: the answers) and, where its
    training starts from another head (`training.init`), that head's directory."""
    settings = feature_head_training(wildcards)  # its data names and init are checked with the config
    init = settings.get("init")
    return {"target": model_dir(config["target"]),
            "data": [HEAD_DATA_DIRS[n] for n in settings.get("data", ["answers"])],
            **({"init": model_dir(init)} if init else {})}


def head_corpus_inputs(wildcards):
    """The corpus's archives (through their prompt-source sets, which fetch and check them), the evaluation's
    prompt sources (no chunk may share a line with them) and the tokenizer."""
    sets = sorted({spec["archive_of"] for spec in HEAD_CORPUS["parts"].values()})
    return {"archives": [prompt_source_file(s) for s in sets],
            "evaluation": list(prompt_source_files(config["domains"]).values()),
            "tokenizer": ancient(gguf_tokenizer_dir(config["target"]) if HEAD_ENGINE == "gguf"
                                 else model_dir(config["target"]))}


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


rule feature_head_corpus:
    input:
        unpack(head_corpus_inputs),
    output:
        "resources/feature_head/corpus.parquet",
    params:
        corpus=HEAD_CORPUS,
        prompt_sources=config["prompt_sources"],
        evaluation_sources=prompt_sources_of(config["domains"]),
        download_dir="resources/prompt_sources/archives",
    conda:
        SPECDEC_ENV
    log:
        "logs/feature_head/corpus.log",
    script:
        "../scripts/make_head_corpus.py"


rule feature_head_corpus_data:
    input:
        unpack(feature_head_data_inputs),
        prompts="resources/feature_head/corpus.parquet",
    output:
        directory("resources/feature_head/corpus_data"),
    params:
        engine=HEAD_ENGINE,
        new_tokens=0,  # read, not generated
        runtime=head_data_runtime(),
        parts="resources/feature_head/corpus_parts",
    threads: THREADS
    resources:
        mem_mb=8000,
    conda:
        SPECDEC_ENV
    log:
        "logs/feature_head/corpus_data.log",
    benchmark:
        "benchmarks/feature_head/corpus_data.tsv"
    script:
        "../scripts/feature_head_data.py"


# The answers' text read again (no new generation: the prompt in one forward, the answer in steps of up to 32 rows,
# the bits its generation computed) and the corpus read in one forward a text, with the outputs of
# feature_head.fused_layers kept beside the final hidden states: the data of heads that fuse those layers.
rule feature_head_layer_data:
    input:
        unpack(feature_head_data_inputs),
        prompts=lambda wc: {"answers": "resources/feature_head/data",
                            "corpus": "resources/feature_head/corpus.parquet"}[wc.base],
    output:
        directory("resources/feature_head/{base}_layers"),
    wildcard_constraints:
        base="answers|corpus",
    params:
        engine=HEAD_ENGINE,
        new_tokens=0,  # read, not generated
        runtime=head_data_runtime(),
        parts="resources/feature_head/{base}_layers_parts",
        layers=HEAD_FUSED_LAYERS,
        stepped=lambda wc: wc.base == "answers",  # an answer past its prompt read as its generation computed it
    threads: THREADS
    resources:
        mem_mb=8000,
    conda:
        SPECDEC_ENV
    log:
        "logs/feature_head/{base}_layers.log",
    benchmark:
        "benchmarks/feature_head/{base}_layers.tsv"
    script:
        "../scripts/feature_head_data.py"


rule train_feature_head:
    input:
        unpack(head_training_inputs),
    output:
        model=directory("resources/models/{head}"),
        loss="results/experiments/feature-head/training/{head}/loss.csv",
        plot=report("results/experiments/feature-head/plots/feature_head_{head}.png",
                    caption="../report/feature_head.rst",
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


# head_agreement (`snakemake --cores 2 --configfile LAYER -- head_agreement`, a layer naming the heads, e.g.
# experiments/feature-head-ttt/config.yaml):
# the heads' greedy drafts checked offline, by draft position, on the target's greedy answers to the evaluation
# prompts, on its GGUF file (specdec/study/training/head_agreement.py). No timing: it may share the cores.
HEAD_AGREEMENT = config.get("head_agreement") or None

if HEAD_AGREEMENT:

    rule head_agreement_table:
        input:
            target=gguf_file(config["target"]),
            heads=[model_dir(h) for h in HEAD_AGREEMENT["heads"]],
            prompts=[f"{R}/prompts/{d}.parquet" for d in HEAD_AGREEMENT.get("domains") or config["domains"]],
        output:
            csv=f"{R}/tables/head_agreement.csv",
            md=f"{R}/tables/head_agreement.md",
        params:
            heads=HEAD_AGREEMENT["heads"],
            prompts_per_domain=HEAD_AGREEMENT.get("prompts_per_domain", 5),
            new_tokens=HEAD_AGREEMENT.get("new_tokens", 128),
            k=HEAD_AGREEMENT.get("k", 5),
            runtime={**RUNTIME, "weights": "gguf", "dtype": "float32"},
        threads: THREADS
        resources:
            mem_mb=8000,
        conda:
            SPECDEC_ENV
        log:
            f"{LOG}/head_agreement.log",
        benchmark:
            f"{BENCH}/head_agreement.tsv"
        script:
            "../scripts/head_agreement.py"

    rule head_agreement:
        input:
            rules.head_agreement_table.output.csv,
