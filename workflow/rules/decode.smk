# Decoding stage: per (setting, draft, domain, k, seed), baseline and speculative decoding interleaved in one
# process over the domain's prompts; one parquet row per target pass and one per sequence.


rule decode:
    input:
        unpack(draft_model_input),
        unpack(kernel_inputs),
        target=target_input(),  # a model directory, or with runtime.weights gguf the target's GGUF file
        prompts=f"{R}/prompts/{{domain}}.parquet",
    output:
        steps=f"{R}/runs/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}/steps.parquet",
        sequences=f"{R}/runs/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}/sequences.parquet",
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        plugins=PLUGINS,
        sampling=sampling_params,
        max_new_tokens=DECODING["max_new_tokens"],
        repeats=DECODING["repeats"],
        runtime=RUNTIME,
        prompt_limit=lambda wc: None if wc.setting == "greedy" else DECODING["sampled"].get("prompts_per_domain"),
    threads: THREADS
    resources:
        mem_mb=14000,
        gpu=1 if RUNTIME["device"] == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/decode/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/decode/{{setting}}/{{draft}}/{{domain}}/k{{k}}/seed{{seed}}.tsv"
    script:
        "../scripts/decode.py"
