"""Snakemake script: the target's features (final hidden states after its final norm, fp16) at every position of the
distillation stage's sequences -> resources/feature_head/features/features.safetensors (features_{i} for row i)."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

from specdec.loading import Runtime, load_for_decoding
from specdec.study.distill import load_teacher_data
from specdec.study.feature_head import save_features, target_features
from specdec.study.jobs import read_backend_tables
from specdec.study.logs import log_to

log = logging.getLogger("feature_head_features")


def main(snakemake):
    with log_to(snakemake.log[0]):
        runtime = Runtime(**snakemake.params.runtime)
        target, _ = load_for_decoding(snakemake.input.target, runtime,
                                      read_backend_tables(snakemake.input.get("target_kernels")))
        sequences, _ = load_teacher_data(snakemake.input.teacher)
        ids = [list(map(int, row)) for row in sequences["input_ids"]]
        log.info("features of %d sequences, %d positions", len(ids), sum(map(len, ids)))
        save_features(target_features(target, ids, log=log.info), Path(snakemake.output[0]))


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
