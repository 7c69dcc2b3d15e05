"""Snakemake script: the side-by-side runs of every domain -> {results_dir}/tables/vs_llamacpp.csv (ratios to
llama.cpp plain with bootstrap intervals, per engine, draft, domain and k; printed to the log as the benchmark
command `python -m specdec.study.peers.vs_llamacpp` prints them) and its provenance (machine, our kernel and build,
llama.cpp's build manifest, the GGUF files' checksums, the settings)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import datetime
import logging

import yaml

from specdec.gguf import quant
from specdec.fp32.kernels import kernel_build
from specdec.study.io import read_parquets, write_csv, write_text
from specdec.study.peers.llamacpp import read_build_manifest
from specdec.study.logs import log_to
from specdec.study.machine import machine_record, package_versions
from specdec.study.provenance import kernel_plan_records
from specdec.study.peers.vs_llamacpp import format_ratios, summarize
from specdec.study.prepare.wheels import sha256_file

log = logging.getLogger("vs_llamacpp_table")


def ran_on(runs) -> dict:
    """Our kernel and native build, and llama.cpp's repacking, as the runs recorded them (runs from before they were
    recorded: the table job's own, said so)."""
    recorded = [column for column in ("quant_kernel", "kernel_build", "llamacpp_repack") if column in runs]
    if len(recorded) < 3:
        return {"quant_kernel": quant.kernel_label(), "kernel_build": kernel_build(),
                "recorded_by": "the table job (these runs predate recording them)"}
    return {column: sorted(runs[column].astype(str).unique()) for column in recorded} | {"recorded_by": "the runs"}


def main(snakemake):
    with log_to(snakemake.log[0]):
        p = snakemake.params
        runs = read_parquets(snakemake.input.runs)
        table = summarize(runs, int(p.settings["max_new_tokens"]))
        log.info("ratios to llama.cpp plain, per turn (median [95%% bootstrap interval]):\n%s", format_ratios(table))
        write_csv(table, snakemake.output.table)
        threads = int(p.runtime["threads"])
        plans = kernel_plan_records(dict(p.gguf_files), threads)  # each file's own, as the job loaded them
        record = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine_record(threads),
            "threads": threads,
            "specdec": {**ran_on(runs), "runtime": dict(p.runtime)},
            "llama_cpp_build": read_build_manifest(snakemake.input.build),
            "settings": dict(p.settings),
            "target": p.target,
            "gguf": {name: {"path": path, "sha256": sha256_file(path), "kernel_plan": plans[name]}
                     for name, path in p.gguf_files.items()},
            "packages": package_versions(("specdec", "torch", "gguf", "pandas", "numpy", "snakemake")),
            "n_runs": len(runs),
            "runs_per_method": runs.groupby(["engine", "draft", "k"]).size().rename("n").reset_index()
                                   .to_dict("records"),
        }
        write_text(yaml.safe_dump(record, sort_keys=False), snakemake.output.provenance)



if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
