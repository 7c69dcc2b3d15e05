"""Snakemake script: gather the distribution checks, judge them as one family (Bonferroni), write the table; fail
when a correct sampler is rejected, a sample is impossible, a test with power does not reject its wrong sampler, or
too few tests have power (docs/distribution-check.md)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.report.analysis import judge_distribution_checks
from specdec.study.verify.distribution_verdict import DistributionSettings, failure_messages
from specdec.study.io import read_parquets, write_csv
from specdec.study.logs import log_to

log = logging.getLogger("distribution_table")


class DistributionCheckError(RuntimeError):
    pass


def main(snakemake):
    with log_to(snakemake.log[0]):
        settings = DistributionSettings.from_config(snakemake.params.settings)
        checks = read_parquets(snakemake.input)
        table = judge_distribution_checks(checks, settings.alpha)
        log.info("distribution checks (threshold %.2e):\n%s", table["threshold"].iloc[0], table.to_string(index=False))
        for row in table[table["outcome"] == "no power"].to_dict("records"):
            log.warning("no power on this prompt: %s/%s %s k=%s: TV distance %.4g from '%s', power %.3f at N = %d "
                        "(needs N = %s); not a failure", row["draft"], row["domain"], row["prompt_id"], row["k"],
                        row["tv_distance"], row["wrong_sampler"], row["power"], row["n_samples"], row["n_needed"])
        messages = failure_messages(table, settings.min_powered_share, fixed_n=settings.samples is not None)
        if messages:
            raise DistributionCheckError(f"{len(messages)} distribution check failures:\n" + "\n".join(messages))
        write_csv(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
