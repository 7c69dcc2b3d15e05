"""Snakemake script: per-component timings of one prepared model, m = 1 .. max(k) + 1 -> CSV (kept per machine)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.loading import Runtime, load_for_decoding
from specdec.study.jobs import read_backend_tables
from specdec.study.io import write_csv
from specdec.study.logs import log_to
from specdec.study.profiling import profile_model

log = logging.getLogger("profile_model")


def main(snakemake):
    with log_to(snakemake.log[0]):
        settings, name = snakemake.params.profiling, snakemake.wildcards.profiled
        runtime = Runtime(**{**snakemake.params.runtime, "threads": snakemake.threads})
        model, _ = load_for_decoding(snakemake.input.model, runtime, read_backend_tables(snakemake.input.get("kernels")))  # as the study runs it (dtype, linear kernel)
        positions = [int(m) for m in snakemake.params.positions]
        log.info("profiling %s: m in %s, context %s, %s repeats, runtime %s", name, positions,
                 settings.get("context_length", 256), settings.get("repeats", 10), runtime)
        table = profile_model(model, context_length=int(settings.get("context_length", 256)), positions=positions,
                              repeats=int(settings.get("repeats", 10)), warmup=int(settings.get("warmup", 1)),
                              name=name)
        forward = table[table["component"] == "forward"].groupby("m")["seconds"].median()
        log.info("median forward seconds by m:\n%s", forward.to_string())
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
