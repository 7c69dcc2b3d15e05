"""Snakemake script: the llama.cpp runs and benchmarks -> results/tables/llamacpp.csv (per draft, domain, k),
llamacpp_costs.csv (step and pass costs per model, with the depth and bytes ratios), results/plots/llamacpp.png and
the stage's provenance (build manifest, GGUF files, machine, threads)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import datetime
import logging

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import yaml

from specdec.study.io import read_parquets, write_csv, write_figure, write_text
from specdec.study.peers.llamacpp import engine_speeds, gguf_facts, read_build_manifest, step_costs, summarize
from specdec.study.logs import log_to
from specdec.study.machine import machine_record, package_versions

log = logging.getLogger("llamacpp_table")


def plot(table: pd.DataFrame, path) -> None:
    drafts = list(dict.fromkeys(table["draft"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for draft in drafts:
        for domain, cell in table[table["draft"] == draft].groupby("domain", sort=False):
            label = f"{domain}" if len(drafts) == 1 else f"{draft} / {domain}"
            line = axes[0].errorbar(cell["k"], cell["speedup"],
                                    yerr=[cell["speedup"] - cell["speedup_lo"], cell["speedup_hi"] - cell["speedup"]],
                                    marker="o", capsize=3, label=label)
            axes[0].plot(cell["k"], cell["predicted_speedup"], ls=":", marker="x", color=line[0].get_color())
            axes[1].plot(cell["k"], cell["tokens_per_pass"], marker="o", label=label)
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set(xlabel="k (drafted tokens per pass)", ylabel="speedup over llama.cpp plain (median, 95% CI)",
                title="llama.cpp speculative / plain (x: predicted from tokens/pass and llama-bench costs)")
    axes[1].set(xlabel="k", ylabel="tokens per target pass (llama.cpp '#mean acc len')", title="tokens per pass")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, path)


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        runs = read_parquets(snakemake.input.runs)
        bench = pd.read_parquet(snakemake.input.bench)
        facts = {name: gguf_facts(snakemake.input[name]) for name in p.models}
        costs = step_costs(bench)
        target_step = costs[(costs["model"] == p.target) & (costs["m"] == 0)]["seconds"].iloc[0]
        costs["n_layers"] = costs["model"].map(lambda m: facts[m]["n_layers"])
        costs["step_bytes"] = costs["model"].map(lambda m: facts[m]["step_bytes"])
        costs["depth_ratio"] = costs["n_layers"] / facts[p.target]["n_layers"]
        costs["bytes_ratio"] = costs["step_bytes"] / facts[p.target]["step_bytes"]
        costs["c"] = costs.apply(lambda r: r["seconds"] / target_step if r["m"] == 0 else float("nan"), axis=1)
        prompt_ids = runs.groupby("domain")["prompt_id"].agg(set).to_dict()
        engine = engine_speeds(p.engine_files, prompt_ids)
        if engine.empty:
            log.info("no decode runs of our engine on these prompts ([sweep/]runs/greedy/...): its tokens/s are NaN")
        table = summarize(runs, costs, facts, p.target, engine, threads=int(p.threads),
                          engine_fallback=list(p.study_drafts))
        log.info("\n%s", table.to_string(index=False))
        log.info("\n%s", costs.to_string(index=False))
        write_csv(table, snakemake.output.table)
        write_csv(costs, snakemake.output.costs)
        plot(table, snakemake.output.plot)
        manifest = read_build_manifest(snakemake.input.build)
        record = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "llama_cpp_build": manifest,
            "bench": {k: bench[k].dropna().unique().tolist() for k in ("build_commit", "cpu_info", "n_threads",
                                                                     "n_depth", "flash_attn")},
            "threads": int(p.threads),
            "settings": {**p.settings, "k": list(p.ks), "max_new_tokens": int(p.max_new_tokens)},
            "gguf": {name: {**facts[name], "source": p.model_specs.get(name)} for name in p.models},
            "machine": machine_record(int(p.threads)),
            "packages": package_versions(("specdec", "gguf", "pandas", "numpy", "snakemake")),
            "n_runs": len(runs),
        }
        write_text(yaml.safe_dump(record, sort_keys=False), snakemake.output.provenance)



if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
