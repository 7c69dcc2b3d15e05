"""Snakemake script: train a truncated model on the teacher data (resuming from checkpoints), save it as a prepared
model, write its loss curve and plot."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from specdec.fp32.loading import load_model, read_manifest  # noqa: E402
from specdec.study.training.distill import DistillSettings, distill, load_teacher_data  # noqa: E402
from specdec.study.io import write_csv, write_figure  # noqa: E402
from specdec.study.logs import log_to  # noqa: E402
from specdec.study.prepare.models import save_prepared  # noqa: E402

log = logging.getLogger("distill_draft")


def main(snakemake):
    with log_to(snakemake.log[0]):
        torch.set_num_threads(int(snakemake.config["runtime"]["threads"]))  # not snakemake.threads
        settings = DistillSettings(**snakemake.params.settings)
        student, tokenizer = load_model(snakemake.input.init, dtype="float32")
        sequences, tensors = load_teacher_data(snakemake.input.teacher)
        log.info("distilling %s (%d layers) on %d sequences: %s", snakemake.wildcards.distilled,
                 student.config.num_hidden_layers, len(sequences), settings)
        curve = distill(student, sequences, tensors, settings, Path(snakemake.params.checkpoints), log=log.info)
        write_csv(curve, snakemake.output.loss)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(curve["step"], curve["loss"], marker=".", linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("KL(target || draft), top-k")
        ax.set_title(f"distillation of {snakemake.wildcards.distilled}")
        fig.tight_layout()
        write_figure(fig, snakemake.output.plot)
        init = read_manifest(snakemake.input.init)
        source = {"source": "distilled", "from": str(snakemake.input.init), "from_source": init.get("source"),
                  "settings": snakemake.params.settings, "final_loss": float(curve["loss"].iloc[-1]),
                  "first_loss": float(curve["loss"].iloc[0]), "training_sequences": len(sequences)}
        save_prepared(student, tokenizer, snakemake.output.model, source)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
