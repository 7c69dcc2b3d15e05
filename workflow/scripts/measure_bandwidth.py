"""Snakemake script: the machine's memory read bandwidth (bytes/s), measured once -> json."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import json
import logging

import torch

from specdec.study.io import write_text
from specdec.study.logs import log_to
from specdec.study.cost.profiling import memory_bandwidth

log = logging.getLogger("measure_bandwidth")
BUFFER_BYTES = 1024 * 2**20  # far larger than any last-level cache


def main(snakemake):
    with log_to(snakemake.log[0]):
        threads = int(snakemake.config["runtime"]["threads"])  # not snakemake.threads: capped at --cores
        torch.set_num_threads(threads)
        bandwidth = memory_bandwidth(BUFFER_BYTES, repeats=int(snakemake.params.repeats))
        log.info("read bandwidth %.2f GB/s (%d threads, %d MiB buffer)", bandwidth / 1e9, threads,
                 BUFFER_BYTES // 2**20)
        result = {"bytes_per_second": bandwidth, "threads": threads, "buffer_bytes": BUFFER_BYTES,
                  "machine": snakemake.params.machine}
        write_text(json.dumps(result, indent=2) + "\n", snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
