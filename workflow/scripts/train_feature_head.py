"""Snakemake script: train one feature-level draft head on the target's features -> its model directory (weights,
config, drafting vocabulary, training record), the loss curve and its plot. Resumes from its checkpoints."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from specdec.drafts.feature_head import WEIGHTS_FILE, FeatureHead  # noqa: E402
from specdec.fp32.loading import load_model  # noqa: E402
from specdec.study.training.feature_head import (  # noqa: E402
    load_head_data,
    save_trained_head,
    settings_from_config,
    train_head_for,
)
from specdec.study.io import atomic_directory, write_csv, write_figure  # noqa: E402
from specdec.study.prepare.wheels import sha256_file  # noqa: E402
from specdec.study.logs import log_to  # noqa: E402

log = logging.getLogger("train_feature_head")


def main(snakemake):
    with log_to(snakemake.log[0]):
        torch.set_num_threads(int(snakemake.config["runtime"]["threads"]))
        settings = settings_from_config(snakemake.params.settings, f"draft_kinds.{snakemake.wildcards.head}")
        target, _ = load_model(snakemake.input.target, dtype="float32")
        data = [Path(d) for d in snakemake.input.data]
        ids, features = load_head_data(*data, layers=settings.fused_layers)
        log.info("training feature head %s on %d sequences (%d positions) from %s: %s", snakemake.wildcards.head,
                 len(ids), sum(map(len, ids)), ", ".join(map(str, data)), settings)
        init = FeatureHead.load(snakemake.input.init) if settings.init else None
        priced = snakemake.config["draft_kinds"][snakemake.wildcards.head].get("vocab")
        if init is not None and priced is not None and priced != len(init.draft_vocab):
            raise ValueError(f"config key 'draft_kinds.{snakemake.wildcards.head}.vocab': {priced}, but the head it "
                             f"starts from ({snakemake.input.init}) drafts from {len(init.draft_vocab)} tokens")
        if init is not None:
            log.info("starting from the trained head %s (%d-token drafting vocabulary)%s", snakemake.input.init,
                     len(init.draft_vocab), f", widened to fuse layers {list(settings.fused_layers)}"
                     if settings.fused_layers and not init.config.fused_layers else "")
        head, curve = train_head_for(target, ids, features, settings, Path(snakemake.params.checkpoints),
                                     log=log.info, init=init)
        write_csv(curve, snakemake.output.loss)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(curve["step"], curve["loss"], marker=".", linewidth=1, label="total")
        ax.plot(curve["step"], curve["feature_loss"], linewidth=1, label="feature")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(f"feature head {snakemake.wildcards.head}")
        ax.legend()
        fig.tight_layout()
        write_figure(fig, snakemake.output.plot)
        with atomic_directory(snakemake.output.model) as tmp:
            save_trained_head(head, tmp, snakemake.wildcards.head, {
                "training": snakemake.params.settings, "training_sequences": len(ids),
                "training_positions": sum(map(len, ids)),
                **({"init_sha256": sha256_file(Path(snakemake.input.init) / WEIGHTS_FILE)} if init is not None else {}),
                "first_loss": float(curve["loss"].iloc[0]), "final_loss": float(curve["loss"].iloc[-1])})


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
