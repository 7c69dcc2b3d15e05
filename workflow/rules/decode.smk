# Decoding stage: per (setting, draft, domain, k, seed), baseline and speculative decoding interleaved in one
# process over the domain's prompts; one parquet row per target pass and one per sequence.


rule decode:
    input:
        unpack(draft_model_input),
        target=model_dir(config["target"]),
        prompts="results/prompts/{domain}.parquet",
    output:
        steps="results/runs/{setting}/{draft}/{domain}/k{k}/seed{seed}/steps.parquet",
        sequences="results/runs/{setting}/{draft}/{domain}/k{k}/seed{seed}/sequences.parquet",
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        sampling=sampling_params,
        max_new_tokens=DECODING["max_new_tokens"],
        repeats=DECODING.get("repeats", 1),
        runtime=RUNTIME,
        prompt_limit=lambda wc: None if wc.setting == "greedy" else DECODING["sampled"].get("prompts_per_domain"),
    threads: workflow.cores
    resources:
        mem_mb=14000,
        gpu=1 if RUNTIME.get("device") == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        "logs/decode/{setting}/{draft}/{domain}/k{k}/seed{seed}.log",
    benchmark:
        "benchmarks/decode/{setting}/{draft}/{domain}/k{k}/seed{seed}.tsv"
    script:
        "../scripts/decode.py"
