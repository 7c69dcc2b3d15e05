"""Checks of a study configuration: the JSON schema (types, ranges, unknown keys), each draft's kind and fields (the
draft-kind registry) and the cross-references a schema cannot express. Every message names the offending key.
The Snakefile runs the same checks at start."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import jsonschema
import yaml

from ..drafts import check_spec, get_kind, load_plugins
from ..errors import DraftSpecError


class ConfigError(ValueError):
    pass


def _first_error(validator, instance, key_prefix: str = "") -> str | None:
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    key = ".".join([key_prefix, *map(str, first.absolute_path)] if key_prefix else map(str, first.absolute_path))
    return f"config key '{key or '(top level)'}': {first.message}"


def check_schema(config: dict, schema_path: str | Path) -> None:
    schema = yaml.safe_load(Path(schema_path).read_text())
    message = _first_error(jsonschema.Draft202012Validator(schema), config)
    if message:
        raise ConfigError(message)
    _check_draft_fields(config, schema)


def draft_spec(config: Mapping, name: str) -> dict:
    """A draft by name: a model under `models` (kind 'model') or an entry of `draft_kinds`."""
    if name in config["models"]:
        return {"kind": "model", "model": name}
    return dict(config["draft_kinds"][name])


def defined_drafts(config: Mapping) -> list[str]:
    return list(dict.fromkeys([*config["models"], *(config.get("draft_kinds") or {})]))


def _check_draft_fields(config: Mapping, schema: Mapping) -> None:
    """Each draft_kinds entry against its kind: known kind, no unknown or missing field, each field's value by the
    JSON schema the kind gives it (resolved within the config schema, so a field may $ref its $defs)."""
    try:
        load_plugins(config.get("plugins") or [])
        for name, spec in (config.get("draft_kinds") or {}).items():
            check_spec(spec, f"draft_kinds.{name}", schema.get("$defs", {}))
    except DraftSpecError as e:
        raise ConfigError(str(e)) from e


def check_config_semantics(config: dict) -> None:
    """Cross-references the JSON schema cannot check."""
    models = config["models"]
    kinds = config.get("draft_kinds") or {}
    defined = defined_drafts(config)

    def kind_of(name):
        return get_kind(draft_spec(config, name)["kind"])

    if config["target"] not in models:
        raise ConfigError(f"config key 'target': model {config['target']!r} is not defined under 'models' "
                          f"(defined: {sorted(models)})")
    if config["target"] in config["drafts"]:
        raise ConfigError(f"config key 'drafts': {config['target']!r} is the target itself")
    for name in config["drafts"]:
        if name not in defined:
            raise ConfigError(f"config key 'drafts': {name!r} is defined neither under 'models' "
                              f"(defined: {sorted(models)}) nor under 'draft_kinds' (defined: {sorted(kinds)})")
    for name, spec in kinds.items():
        if name in models:
            raise ConfigError(f"config key 'draft_kinds.{name}': the name is already a model under 'models'")
        if "model" in spec and spec["model"] not in models:
            raise ConfigError(f"config key 'draft_kinds.{name}.model': {spec['model']!r} is not under 'models'")
        kind = kind_of(name)
        shared = kind.shared_model(spec)
        if shared is not None and (shared not in kinds or kinds[shared].get("kind") != spec.get("kind")
                                   or not kind_of(shared).makes_own_model(kinds[shared])):
            raise ConfigError(f"config key 'draft_kinds.{name}.{kind.shared_from}': {shared!r} is not a "
                              f"{spec.get('kind')} draft under 'draft_kinds' with a model of its own")
    training_domains = ((config.get("distillation") or {}).get("domains") or {}).items()
    head_domains = (((config.get("feature_head") or {}).get("data") or {}).get("domains") or {}).items()
    for key, domain, spec in [*(("domains", d, s) for d, s in config["domains"].items()),
                              *(("distillation.domains", d, s) for d, s in training_domains),
                              *(("feature_head.data.domains", d, s) for d, s in head_domains)]:
        for entry in spec["sources"]:
            if entry["set"] not in config["prompt_sources"]:
                raise ConfigError(f"config key '{key}.{domain}.sources': prompt set {entry['set']!r} is not "
                                  f"defined under 'prompt_sources' (defined: {sorted(config['prompt_sources'])})")
    _check_head_training(config, kinds)  # after the kinds' own checks: every draft_kinds entry names a known kind
    for name in (config["decoding"].get("sampled") or {}).get("drafts") or []:
        if name not in config["drafts"]:
            raise ConfigError(f"config key 'decoding.sampled.drafts': {name!r} is not a studied draft (under "
                              f"'drafts': {config['drafts']})")
    for name in (config.get("distribution_check") or {}).get("drafts") or []:
        if name not in defined or kind_of(name).model is None:
            raise ConfigError(f"config key 'distribution_check.drafts': {name!r} is not a draft (under 'models' or "
                              "'draft_kinds') that loads a model of its own (the check memoises the draft's "
                              "forwards)")
    distribution = config.get("distribution_check") or {}
    if distribution.get("min_samples", 1) > distribution.get("max_samples", 100_000):
        raise ConfigError(f"config key 'distribution_check.min_samples': {distribution['min_samples']} is above "
                          f"distribution_check.max_samples ({distribution.get('max_samples', 100_000)})")
    for name in (config.get("profiling") or {}).get("extra_models") or []:
        if name not in models:
            raise ConfigError(f"config key 'profiling.extra_models': {name!r} is not under 'models'")
    peers = config.get("peers") or {}
    for name in peers.get("drafts") or []:
        if name not in defined or not kind_of(name).assisted(draft_spec(config, name)):
            raise ConfigError(f"config key 'peers.drafts': {name!r} is not a draft (under 'models' or 'draft_kinds') "
                              "that Hugging Face's assisted generation can run (a plain model draft)")
    for key, domains in (("peers.domains", peers.get("domains")),
                         ("decoding.domains", config["decoding"].get("domains")),
                         ("head_agreement.domains", (config.get("head_agreement") or {}).get("domains"))):
        for domain in domains or []:
            if domain not in config["domains"]:
                raise ConfigError(f"config key '{key}': {domain!r} is not under 'domains'")
    sweep = config.get("draft_sweep") or {}
    for name in sweep.get("drafts") or []:
        if name not in defined:
            raise ConfigError(f"config key 'draft_sweep.drafts': {name!r} is neither under 'models' nor under "
                              f"'draft_kinds' (defined: {sorted(defined)})")
    overrides = {name: o for name, o in (sweep.get("per_draft") or {}).items() if o is not None}  # null: dropped
    for name in overrides:
        if name not in (sweep.get("drafts") or []):
            raise ConfigError(f"config key 'draft_sweep.per_draft.{name}': {name!r} is not under 'draft_sweep.drafts'")
    for key, domains in [("draft_sweep.domains", sweep.get("domains") or []),
                         *((f"draft_sweep.per_draft.{n}.domains", o.get("domains") or [])
                           for n, o in overrides.items())]:
        for domain in domains:
            if domain not in config["domains"]:
                raise ConfigError(f"config key '{key}': {domain!r} is not under 'domains'")
    reproduce = config.get("reproduce") or {}
    for key, known in (("drafts", config["drafts"]), ("domains", list(config["domains"])),
                       ("k", config["decoding"]["k"])):
        for value in reproduce.get(key) or []:
            if value not in known:
                raise ConfigError(f"config key 'reproduce.{key}': {value!r} is not in the study's {key} {known}")
    decoding = config["decoding"]
    if not decoding.get("greedy", True) and not decoding.get("sampled"):
        raise ConfigError("config key 'decoding': neither the greedy nor a sampled setting is enabled")


# a feature head's training.data (workflow/rules/feature_head.smk); *_layers: the same text with the outputs of
# feature_head.fused_layers beside the features, for heads that fuse them (training.fused_layers)
HEAD_DATA_SETS = ("answers", "corpus", "answers_layers", "corpus_layers")


def _check_head_training(config: Mapping, kinds: Mapping) -> None:
    """A feature head's training names known data sets (corpus only with feature_head.corpus) and starts, if from
    another head, from a feature-head draft with a head of its own; the corpus reads archives of prompt sources."""
    corpus = (config.get("feature_head") or {}).get("corpus")

    def trains_a_head(name):  # the registry says which kinds the head-training stage makes
        kind = get_kind(kinds[name]["kind"])
        return kind.made_by == "train_feature_head" and kind.makes_own_model(kinds[name])

    for name, spec in kinds.items():
        if not trains_a_head(name):
            continue
        training = spec.get("training") or {}
        fused = list(training.get("fused_layers") or [])
        for data in training.get("data") or ["answers"]:
            if data not in HEAD_DATA_SETS:
                raise ConfigError(f"config key 'draft_kinds.{name}.training.data': {data!r} is not one of "
                                  f"{list(HEAD_DATA_SETS)}")
            if data.startswith("corpus") and not corpus:
                raise ConfigError(f"config key 'draft_kinds.{name}.training.data': {data} needs feature_head.corpus")
            # the data's rows must hold the layers the head fuses (a head may read fewer: the control of one)
            data_layers = list((config.get("feature_head") or {}).get("fused_layers") or []) \
                if data.endswith("_layers") else []
            if not set(fused) <= set(data_layers):
                raise ConfigError(f"config key 'draft_kinds.{name}.training.data': {data} holds the outputs of layers "
                                  f"{data_layers} (feature_head.fused_layers for *_layers data), the head fuses "
                                  f"{fused} (training.fused_layers)")
        init = training.get("init")
        if init is not None and (init == name or init not in kinds or not trains_a_head(init)):
            raise ConfigError(f"config key 'draft_kinds.{name}.training.init': {init!r} is not another feature_head "
                              "draft with a head of its own")
    agreement = config.get("head_agreement") or {}
    for name in agreement.get("heads") or []:
        if name not in kinds or not trains_a_head(name):
            raise ConfigError(f"config key 'head_agreement.heads': {name!r} is not a feature_head draft with a head "
                              "of its own")
    for part, spec in ((corpus or {}).get("parts") or {}).items():
        if spec["archive_of"] not in config["prompt_sources"]:
            raise ConfigError(f"config key 'feature_head.corpus.parts.{part}.archive_of': {spec['archive_of']!r} is "
                              f"not under 'prompt_sources' (defined: {sorted(config['prompt_sources'])})")


def validate_config(config: dict, schema_path: str | Path) -> None:
    check_schema(config, schema_path)
    check_config_semantics(config)
