"""Snakemake script: the draft sweep's cells as measured, without the cost model (which needs profiled models:
drafts.csv) -> results/tables/sweep_cells.csv: acceptance, tokens per pass and speedup (study_table), greedy
identity counts, the step costs measured in the runs themselves (c = draft step / target step, the verify pass
over k + 1 positions in target steps), and the speedup those costs give after the prompt pass: decode tokens per
pass / (a block's drafting, catch-up and verify, in target steps) — where it matches the measured speedup, the wall
clock follows the algorithm. With them, sweep_cells.provenance.yaml: machine, packages, models, the decode jobs' wall
times, the native build, the config."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

import yaml

from specdec.study.report.analysis import classify_greedy, greedy_identity_table, study_table, to_markdown
from specdec.study.cost.model import audited_step_timings
from specdec.study.io import read_parquets, write_csv, write_text
from specdec.study.logs import log_to
from specdec.study.provenance import provenance

log = logging.getLogger("sweep_cells")
KEYS = ["draft", "domain", "k"]


def main(snakemake):
    with log_to(snakemake.log[0]):
        sequences = read_parquets(snakemake.input.sequences)
        steps = read_parquets(snakemake.input.steps)
        audit = audited_step_timings(steps)
        block = (audit["draft_seconds_per_block"] + audit["catchup_seconds_per_block"].fillna(0)
                 + audit["verify_seconds"])
        audit["block_cost_steps"] = block / audit["target_step_seconds"]
        audit["decode_speedup_audited"] = audit["decode_tokens_per_pass"] / audit["block_cost_steps"]
        audit = audit[[*KEYS, "c", "verify_cost_ratio", "block_cost_steps", "decode_tokens_per_pass",
                       "decode_speedup_audited", "target_step_seconds"]]
        table = (study_table(sequences).drop(columns="temperature")
                 .merge(greedy_identity_table(classify_greedy(sequences)), on=KEYS)
                 .merge(audit, on=KEYS))
        log.info("\n%s", table.to_string(index=False))
        write_csv(table, snakemake.output.csv)
        write_text(to_markdown(table), snakemake.output.md)
        record = provenance(dict(snakemake.params.config), snakemake.input.models, snakemake.input.benchmarks,
                            int(snakemake.params.threads))
        write_text(yaml.safe_dump(record, sort_keys=False), snakemake.output.provenance)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
