# The draft sweep (README, "Shallower drafts"): greedy runs of every draft in draft_sweep.drafts on every domain,
# all of draft_sweep.k in one process per (draft, domain) with a single baseline timed next to them, over the first
# draft_sweep.prompts_per_domain prompts (per_draft may narrow both for single drafts). Its cells join the study's in
# drafts.csv (costmodel stage).
SWEEP = config.get("draft_sweep") or {}
SWEEP_K = SWEEP.get("k") or DECODING["k"]


def sweep_drafts():
    return list(SWEEP.get("drafts") or [])


def sweep_setting(draft, key, default):
    """A sweep setting for one draft: its per_draft override, else the sweep's, else `default`."""
    return ((SWEEP.get("per_draft") or {}).get(draft) or {}).get(key) or SWEEP.get(key) or default


def sweep_run_files(name):
    return [f"results/sweep/runs/greedy/{d}/{dom}/k{k}/seed0/{name}" for d in sweep_drafts()
            for dom in sweep_setting(d, "domains", list(config["domains"])) for k in SWEEP_K]


use rule decode as sweep_decode with:
    output:
        steps=expand("results/sweep/runs/{{setting}}/{{draft}}/{{domain}}/k{k}/seed{{seed}}/steps.parquet", k=SWEEP_K),
        sequences=expand("results/sweep/runs/{{setting}}/{{draft}}/{{domain}}/k{k}/seed{{seed}}/sequences.parquet",
                         k=SWEEP_K),
    params:
        draft_spec=lambda wc: draft_spec(wc.draft),
        sampling=sampling_params,
        max_new_tokens=DECODING["max_new_tokens"],
        repeats=SWEEP.get("repeats", 1),
        runtime=RUNTIME,
        prompt_limit=lambda wc: sweep_setting(wc.draft, "prompts_per_domain", None),
        ks=SWEEP_K,
    log:
        "logs/sweep/{setting}/{draft}/{domain}/seed{seed}.log",
    benchmark:
        "benchmarks/sweep/{setting}/{draft}/{domain}/seed{seed}.tsv"


rule sweep:
    input:
        sweep_run_files("sequences.parquet"),
