"""Snakemake script: llama-bench of the target and every llama.cpp draft (one-token steps and passes over m = 1..9
positions after a prefill of `depth` positions), rounds in rotating model order, threads = runtime.threads."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

from specdec.study.io import write_parquet
from specdec.study.peers.llamacpp import bench_job
from specdec.study.logs import log_to

log = logging.getLogger("llamacpp_bench")


def main(snakemake):
    with log_to(snakemake.log[0]):
        b = snakemake.params.bench
        models = {name: snakemake.input[name] for name in snakemake.params.models}
        threads = int(snakemake.config["runtime"]["threads"])  # not snakemake.threads: capped at --cores
        frame = bench_job(models, bin_dir=Path(snakemake.input.build) / "bin", threads=threads,
                          depth=int(b["depth"]), max_positions=int(b["max_positions"]),
                          gen_tokens=int(b["gen_tokens"]), repetitions=int(b["repetitions"]),
                          rounds=int(b["rounds"]), repack=bool(snakemake.params.repack), log=log.info,
                          raw=lambda name, out: log.info("%s\n%s", name, out))
        write_parquet(frame, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
