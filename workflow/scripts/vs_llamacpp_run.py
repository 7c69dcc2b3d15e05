"""Snakemake script: our engine and llama.cpp side by side on one domain's prompts (specdec/study/peers/vs_llamacpp.py):
our plain and speculative decoding (each vs_llamacpp draft at its k) in this process, llama.cpp's plain and
speculative runs as fresh processes, per prompt in rotating order, on runtime.threads threads; one row per run."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
import tempfile
from pathlib import Path

import pandas as pd

from specdec.drafts import load_plugins
from specdec.drafts.registry import gguf_draft_source
from specdec.fp32.kernels import kernel_build
from specdec.gguf.lean import product_kernel
from specdec.load import load_target, make_draft
from specdec.runtime import Runtime
from specdec.study.io import write_parquet
from specdec.study.peers.llamacpp import RunSettings
from specdec.study.logs import log_to
from specdec.study.peers.vs_llamacpp import llamacpp_runner, methods_for, ours_runner, side_by_side_job

log = logging.getLogger("vs_llamacpp")


def main(snakemake):
    with log_to(snakemake.log[0]):
        p, inputs = snakemake.params, snakemake.input
        load_plugins(p.plugins)
        s = p.settings
        runtime = Runtime(**p.runtime)
        prompts = pd.read_parquet(inputs.prompts)
        if p.prompts_per_domain:
            prompts = prompts.head(int(p.prompts_per_domain))
        n = int(s["max_new_tokens"])
        longest = int(prompts["input_ids"].map(len).max()) + n + 1  # the static KV cache's positions
        target, vocabulary = load_target(inputs.target, runtime, None, longest)
        proposers = {}
        for name, spec in p.draft_specs.items():
            source = gguf_draft_source(name, spec)  # (the model whose file it runs, layers), or None
            # None: no model, or one of its own kind (a feature head's directory, own_<draft>)
            path = inputs.get(f"draft_{source[0]}") if source else inputs.get(f"own_{name}")
            proposers[name] = make_draft(name, dict(spec), target, vocabulary, path, runtime)
        llama = s["llamacpp"]
        methods = methods_for(s["drafts"], llama["draft"], int(llama["k"]))
        log.info("%d prompts, %d new tokens, methods: %s", len(prompts), n, ", ".join(map(str, methods)))
        settings = RunSettings(threads=runtime.threads, max_new_tokens=n, ctx_size=int(p.ctx_size),
                               repack=bool(p.repack))
        with tempfile.TemporaryDirectory(dir=Path(snakemake.output[0]).parent.parent) as tmp:
            frame = side_by_side_job(
                prompts, methods, run_ours=ours_runner(target, proposers),
                run_llamacpp=llamacpp_runner(Path(inputs.build) / "bin", inputs.target, inputs.get("llamacpp_draft"),
                                             settings, tmp),
                max_new_tokens=n, repeats=int(s["repeats"]), log=log.info)
        # what ran, recorded with the runs themselves (the table's provenance reads it from them)
        frame = frame.assign(domain=snakemake.wildcards.domain,
                             quant_kernel=product_kernel(getattr(target, "model", None)).removeprefix("gguf-"),
                             kernel_build=kernel_build(), llamacpp_repack=bool(p.repack))
        write_parquet(frame, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
