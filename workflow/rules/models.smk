# Models stage: each model of config.yaml becomes resources/models/{model}/ (safetensors + tokenizer + manifest).
# Models are shared by every run (the study, the quick run), so their logs are too.


rule prepare_model:
    output:
        directory("resources/models/{model}"),
    params:
        spec=lambda wc: config["models"][wc.model],
        download_dir=lambda wc: f"resources/downloads/{wc.model}",
        dtype="float32",
    conda:
        SPECDEC_ENV
    log:
        "logs/models/{model}.log",
    benchmark:
        "benchmarks/models/{model}.tsv"
    resources:
        mem_mb=16000,  # converting the 1.5B GGUF peaks near 2x its fp32 size
    script:
        "../scripts/prepare_model.py"


# The gguf regime's tokenizer: read once from the GGUF file and saved as a tokenizer directory (the prompts stage
# reads it; decode jobs compare the files' vocabularies from their headers and need no tokenizer).
rule gguf_tokenizer:
    input:
        gguf_file("{model}"),
    output:
        directory(gguf_tokenizer_dir("{model}")),
    conda:
        SPECDEC_ENV
    log:
        "logs/gguf/{model}.tokenizer.log",
    script:
        "../scripts/gguf_tokenizer.py"


rule derive_truncated_draft:
    input:
        lambda wc: model_dir(draft_spec(wc.derived)["model"]),
    output:
        directory("resources/models/{derived}"),
    params:
        layers=lambda wc: draft_spec(wc.derived)["layers"],
    conda:
        SPECDEC_ENV
    log:
        "logs/models/{derived}.log",
    script:
        "../scripts/derive_truncated_draft.py"
