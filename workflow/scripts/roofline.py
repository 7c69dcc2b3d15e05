"""Snakemake script: the target's step and verify passes against the bandwidth floor, per linear-backend candidate
(each backend alone, and the per-machine choice) -> roofline_kernels.csv; the summary goes to the log."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import json
import logging
import sys

from specdec.fp32.kernels import available_backends
from specdec.fp32.loading import load_for_decoding
from specdec.runtime import Runtime
from specdec.study.io import read_backend_tables, write_csv
from specdec.study.logs import log_to
from specdec.study.cost.roofline import kernel_roofline

log = logging.getLogger("roofline")


def main(snakemake):
    with log_to(snakemake.log[0]):
        params = snakemake.params
        bandwidth = json.loads(open(snakemake.input.bandwidth).read())["bytes_per_second"]
        threads = int(snakemake.config["runtime"]["threads"])  # not snakemake.threads: capped at --cores
        model, _ = load_for_decoding(snakemake.input.target, Runtime(linear_kernel="default", threads=threads))
        candidates = {name: name for name in available_backends()}
        candidates["auto (chosen)"] = read_backend_tables(snakemake.input.kernels)
        table = kernel_roofline(model, bandwidth, candidates, positions=list(params.positions),
                                repeats=int(params.repeats), context_length=int(params.context_length), log=log.info)
        wide = table.pivot(index="candidate", columns="m", values="over_m1")
        first = table[table["m"] == 1].set_index("candidate")
        summary = "\n".join([
            f"read bandwidth {bandwidth / 1e9:.1f} GB/s, weights {first['weight_bytes'].iloc[0] / 1e9:.2f} GB, "
            f"floor {first['floor_seconds'].iloc[0] * 1e3:.0f} ms",
            "one-token step T(1) and T(1) / floor:", first[["seconds", "over_floor"]].round(3).to_string(),
            "verify pass T(m) / T(1):", wide.round(2).to_string()])
        log.info("%s", summary)
        print(summary, file=sys.__stderr__, flush=True)  # the benchmark's answer, on the terminal too
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
