"""Snakemake script: gather the distribution checks, judge them as one family (Bonferroni), write the table; fail
when a correct sampler is rejected or the wrong sampler is not."""

import logging

from specdec.analysis import judge_distribution_checks
from specdec.io import read_parquets, write_csv
from specdec.logs import log_to

log = logging.getLogger("distribution_table")


class DistributionCheckError(RuntimeError):
    pass


def main(snakemake):
    with log_to(snakemake.log[0]):
        checks = read_parquets(snakemake.input)
        table = judge_distribution_checks(checks, float(snakemake.params.alpha))
        log.info("distribution checks (threshold %.2e):\n%s", table["threshold"].iloc[0], table.to_string(index=False))
        failed = table[~table["passed"]]
        if len(failed):
            raise DistributionCheckError(
                f"{len(failed)} distribution checks failed (correct sampler rejected, a sample on an impossible "
                f"continuation, or the wrong sampler not rejected): "
                f"{failed[['draft', 'domain', 'prompt_id', 'k', 'p_value', 'wrong_sampler_p_value']].to_dict('records')}")
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
