# Peers: Hugging Face generate and assisted generation against our baseline and speculative decoding, same models,
# prompts and settings, interleaved in one process (greedy).

PEERS = config.get("peers") or None


def peers_drafts():
    """peers.drafts, else every draft that is a plain separate model (what assisted generation takes)."""
    named = (PEERS or {}).get("drafts")
    if named is not None:
        return named
    return [d for d in config["drafts"] if draft_spec(d)["kind"] == "model" and "min_confidence" not in draft_spec(d)]


def peers_files():
    domains = (PEERS or {}).get("domains") or list(config["domains"])
    return [f"results/peers/{d}/{dom}/k{k}.parquet" for d in peers_drafts() for dom in domains
            for k in (PEERS or {}).get("k", [4, 8])]


rule peers:
    input:
        unpack(draft_model_input),
        target=model_dir(config["target"]),
        prompts="results/prompts/{domain}.parquet",
    output:
        "results/peers/{draft}/{domain}/k{k}.parquet",
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        max_new_tokens=DECODING["max_new_tokens"],
        prompts_per_domain=(PEERS or {}).get("prompts_per_domain", 3),
        repeats=(PEERS or {}).get("repeats", 1),
        runtime=RUNTIME,
    threads: workflow.cores
    resources:
        mem_mb=14000,
        gpu=1 if RUNTIME.get("device") == "cuda" else 0,
    conda:
        SPECDEC_ENV
    log:
        "logs/peers/{draft}/{domain}/k{k}.log",
    benchmark:
        "benchmarks/peers/{draft}/{domain}/k{k}.tsv"
    script:
        "../scripts/peers.py"


rule peers_table:
    input:
        peers_files(),
    output:
        report("results/tables/peers.csv", caption="../report/peers.rst", category="Peers"),
    conda:
        SPECDEC_ENV
    log:
        "logs/peers/peers_table.log",
    script:
        "../scripts/peers_table.py"
