"""Snakemake script: per-component timings of one prepared model, m = 1 .. max(k) + 1 -> parquet."""

import logging

from specdec.io import write_parquet
from specdec.logs import log_to
from specdec.profiling import profile_model
from specdec.study import Runtime, load_for_decoding

log = logging.getLogger("profile_model")


def main(snakemake):
    with log_to(snakemake.log[0]):
        settings, name = snakemake.params.profiling, snakemake.wildcards.profiled
        runtime = Runtime(**snakemake.params.runtime, threads=snakemake.threads)
        model, _ = load_for_decoding(snakemake.input[0], runtime)  # as the study runs it (dtype, linear kernel)
        positions = [int(m) for m in snakemake.params.positions]
        log.info("profiling %s: m in %s, context %s, %s repeats, runtime %s", name, positions,
                 settings.get("context_length", 256), settings.get("repeats", 10), runtime)
        table = profile_model(model, context_length=int(settings.get("context_length", 256)), positions=positions,
                              repeats=int(settings.get("repeats", 10)), warmup=int(settings.get("warmup", 1)),
                              name=name)
        forward = table[table["component"] == "forward"].groupby("m")["seconds"].median()
        log.info("median forward seconds by m:\n%s", forward.to_string())
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
