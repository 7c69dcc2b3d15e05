"""Snakemake script: time the linear products this machine has on one model's own weights, by weight shape and row
count -> CSV (kept per machine and kernel build). fp32 (params.dtype float32): every fp32 backend
(specdec.fp32.kernels); bf16: torch's bf16 product, the AVX2 kernel on the bf16 weights and the fp32 copy. Jobs with
runtime.linear_kernel auto run each product on the fastest; with invariant, a bf16 model's prompt pass does."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import pandas as pd

from specdec.fp32.kernels import available_backends, time_backends, time_bf16_products, use_row_adaptive_bf16_linear
from specdec.fp32.kernel_tables import tables_from_timings
from specdec.fp32.loading import load_for_decoding
from specdec.runtime import Runtime
from specdec.study.io import write_csv
from specdec.study.logs import log_to

log = logging.getLogger("time_linear_backends")


def main(snakemake):
    with log_to(snakemake.log[0]):
        dtype, params = snakemake.params.dtype, snakemake.params
        threads = int(snakemake.config["runtime"]["threads"])  # not snakemake.threads: capped at --cores
        model, _ = load_for_decoding(snakemake.input[0], Runtime(dtype=dtype, linear_kernel="default", threads=threads))
        log.info("timing %s products on %s, rows %s, %s repeats, %d threads", dtype, snakemake.input[0], params.rows,
                 params.repeats, threads)
        if dtype == "bfloat16":
            timings = time_bf16_products(use_row_adaptive_bf16_linear(model), params.rows, int(params.repeats),
                                         log=log.info)
        else:
            log.info("fp32 backends: %s", available_backends())
            timings = time_backends(model, rows=params.rows, repeats=int(params.repeats), log=log.info)
        for shape, table in tables_from_timings(timings).items():
            log.info("fastest for %s: %s", shape, table)
        write_csv(pd.DataFrame(timings), snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
