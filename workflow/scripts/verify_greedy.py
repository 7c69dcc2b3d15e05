"""Snakemake script: classify every greedy speculative sequence (identical / near_tie / divergent); fail on any
divergence that the diagnosis cannot explain as a floating-point near-tie."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.report.analysis import classify_greedy, greedy_identity_table
from specdec.study.io import read_parquets, write_csv, write_parquet
from specdec.study.logs import log_to

log = logging.getLogger("verify_greedy")


class GreedyDivergenceError(RuntimeError):
    pass


def verify_greedy(sequence_files):
    sequences = read_parquets(sequence_files)
    classified = classify_greedy(sequences)
    table = greedy_identity_table(classified)
    log.info("greedy identity:\n%s", table.to_string(index=False))
    for row in classified[classified["verdict"] != "identical"].itertuples():
        log.info("%s: %s k=%s %s first_diff=%s margin=%.3g path_diff=%.3g", row.verdict, row.domain, row.k,
                 row.prompt_id, row.first_diff, row.margin, row.path_diff)
    return classified, table


def main(snakemake):
    with log_to(snakemake.log[0]):
        classified, table = verify_greedy(snakemake.input)
        divergent = classified[classified["verdict"] == "divergent"]
        if len(divergent):
            raise GreedyDivergenceError(
                f"{len(divergent)} greedy sequences differ from the baseline beyond floating-point near-ties: "
                f"{divergent[['draft', 'domain', 'k', 'prompt_id', 'first_diff']].to_dict('records')}")
        keep = [c for c in classified.columns if c not in ("tokens",)]
        write_parquet(classified[keep], snakemake.output.verdicts)
        write_csv(table, snakemake.output.table)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
