"""Snakemake script: per-component timings of prepared models (or, in the gguf regime, of lean sessions over GGUF
files), m = 1 .. max(k) + 1 -> one CSV per model (kept per machine). One model (profile_model, wildcard `profiled`)
or the fit's models together, interleaved repeat by repeat (profile_fit_models, params.names), so that the
machine's drift lands on every model alike; with them, the feature heads' draft steps over the target
(params.heads: an untrained head per drafting vocabulary and dtype, one CSV each after the models')."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.gguf.loading import load_gguf_for_decoding
from specdec.gguf.lean import LeanLM
from specdec.fp32.loading import load_for_decoding, prepare_for_decoding
from specdec.runtime import Runtime
from specdec.study.io import read_backend_tables, write_csv
from specdec.study.logs import log_to
from specdec.study.cost.profiling import profile_models, random_weights_model

log = logging.getLogger("profile_model")


def as_list(value) -> list:
    """A named input as a list (Snakemake gives one file as a string)."""
    return [value] if isinstance(value, str) else list(value or [])


def gguf_sessions(names, paths, layers, runtime: Runtime, max_length: int) -> dict:
    """A LeanLM session per profiled name (the gguf regime), each file loaded once as a decode job loads it (its
    checks, its threads): a cut shares its model's weights."""
    files = {path: load_gguf_for_decoding(path, runtime, max_length=max_length, log=log.info)[0].model
             for path in dict.fromkeys(paths)}
    return {name: LeanLM(files[path], max_length=max_length, layers=n)
            for name, path, n in zip(names, paths, layers, strict=True)}


def random_model(architecture: dict, runtime: Runtime):
    """A model of this architecture's shapes with random weights, set up as the decode jobs run it (its linear
    kernel): profiling.weights random."""
    return prepare_for_decoding(random_weights_model(architecture, runtime.dtype, runtime.device), runtime)


def head_drafts(heads: dict, target) -> dict:
    """{profile name: FeatureHeadDraft}: an untrained head of each vocabulary and dtype over the target as the decode
    jobs run it (its embeddings, norm and LM head rows; its drafting copy on the same kernels), built by the
    feature_head kind itself from a spec of that vocabulary and dtype."""
    from specdec.drafts import DraftResources, get_kind

    kind = get_kind("feature_head")
    drafts = {}
    for name, head in heads.items():
        spec = {"kind": "feature_head", "vocab": head["vocab"], "dtype": head["dtype"]}
        resources = DraftResources(target=target, vocab_size=int(target.config.vocab_size), eos_token_ids=frozenset(),
                                   draft_model=lambda spec=spec: kind.untrained(spec, target))
        drafts[name] = kind.build(spec, resources)
    return drafts


def main(snakemake):
    with log_to(snakemake.log[0]):
        settings, inputs = snakemake.params.profiling, snakemake.input
        names = list(snakemake.params.get("names") or [snakemake.wildcards.profiled])
        kernels = as_list(inputs.get("kernels")) or [None] * len(names)  # none unless runtime.linear_kernel is auto
        runtime = Runtime(**snakemake.params.runtime)  # not snakemake.threads: capped at --cores
        positions = [int(m) for m in snakemake.params.positions]
        context_length = int(settings.get("context_length", 256))
        architectures = dict(snakemake.params.get("architectures") or {})
        if architectures:  # profiling.weights random: the real shapes, random weights (no weights on this machine)
            models = {name: random_model(architectures[name], runtime) for name in names}
        elif runtime.weights == "gguf":  # lean sessions over the files, a cut over its model's file
            models = gguf_sessions(names, as_list(inputs.models), list(snakemake.params.layers), runtime,
                                   context_length + max(positions))
        else:  # as the study runs them (dtype, linear kernel)
            models = {name: load_for_decoding(directory, runtime, read_backend_tables(table))[0]
                      for name, directory, table in zip(names, as_list(inputs.models), kernels, strict=True)}
        heads = dict(snakemake.params.get("heads") or {})
        if heads:
            models.update(head_drafts(heads, models[snakemake.params.target]))
            names += list(heads)
        log.info("profiling %s interleaved: m in %s, context %s, %s repeats, runtime %s", names, positions,
                 settings.get("context_length", 256), settings.get("repeats", 10), runtime)
        tables = profile_models(models, context_length=context_length, positions=positions,
                                repeats=int(settings.get("repeats", 10)), warmup=int(settings.get("warmup", 1)))
        for (name, table), path in zip(tables.items(), snakemake.output, strict=True):
            forward = table[table["component"] == "forward"].groupby("m")["seconds"].median()
            log.info("%s: median forward seconds by m:\n%s", name, forward.to_string())
            write_csv(table, path)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
