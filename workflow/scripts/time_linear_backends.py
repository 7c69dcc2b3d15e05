"""Snakemake script: time every fp32 linear backend this machine has (specdec.kernels) on one model's own weights,
by weight shape and row count -> CSV; jobs with runtime.linear_kernel: auto run each product on the fastest."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.kernels import available_backends, fastest_backends, time_backends
from specdec.loading import Runtime, load_for_decoding
from specdec.study.io import write_csv
from specdec.study.logs import log_to

log = logging.getLogger("time_linear_backends")


def main(snakemake):
    with log_to(snakemake.log[0]):
        threads = int(snakemake.config["runtime"]["threads"])  # not snakemake.threads: capped at --cores
        model, _ = load_for_decoding(snakemake.input[0], Runtime(linear_kernel="default", threads=threads))
        log.info("timing %s on %s, rows %s, %s repeats, %d threads", available_backends(), snakemake.input[0],
                 snakemake.params.rows, snakemake.params.repeats, threads)
        timings = time_backends(model, rows=snakemake.params.rows, repeats=int(snakemake.params.repeats),
                                log=log.info)
        for shape, table in fastest_backends(timings).items():
            log.info("fastest for %s: %s", shape, table)
        write_csv(pd.DataFrame(timings), snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
