"""Checks of a study configuration: the JSON schema (types, ranges, unknown keys) and the cross-references it cannot
express. Every message names the offending key. The Snakefile runs the same checks at start."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
# Draft kinds that load a model of their own (and so name one, and may set its dtype).
MODEL_LOADING_KINDS = ("model", "truncated", "distilled")


class ConfigError(ValueError):
    pass


def check_schema(config: dict, schema_path: Path = SCHEMA) -> None:
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        key = ".".join(str(p) for p in first.absolute_path) or "(top level)"
        raise ConfigError(f"config key '{key}': {first.message}")


def check_config_semantics(config: dict) -> None:
    """Cross-references the JSON schema cannot check."""
    models = config["models"]
    kinds = config.get("draft_kinds") or {}

    def kind_of(name):
        return kinds.get(name, {"kind": "model"})["kind"]

    if config["target"] not in models:
        raise ConfigError(f"config key 'target': model {config['target']!r} is not defined under 'models' "
                          f"(defined: {sorted(models)})")
    if config["target"] in config["drafts"]:
        raise ConfigError(f"config key 'drafts': {config['target']!r} is the target itself")
    for name in config["drafts"]:
        if name not in models and name not in kinds:
            raise ConfigError(f"config key 'drafts': {name!r} is defined neither under 'models' "
                              f"(defined: {sorted(models)}) nor under 'draft_kinds' (defined: {sorted(kinds)})")
    for name, spec in kinds.items():
        if name in models:
            raise ConfigError(f"config key 'draft_kinds.{name}': the name is already a model under 'models'")
        if spec["kind"] in MODEL_LOADING_KINDS and spec["model"] not in models:
            raise ConfigError(f"config key 'draft_kinds.{name}.model': {spec['model']!r} is not under 'models'")
        if "dtype" in spec and spec["kind"] not in MODEL_LOADING_KINDS:
            raise ConfigError(f"config key 'draft_kinds.{name}.dtype': a {spec['kind']!r} draft has no weights of "
                              "its own to cast (dtype applies to kinds model, truncated and distilled)")
    training_domains = ((config.get("distillation") or {}).get("domains") or {}).items()
    for key, domain, spec in [*(("domains", d, s) for d, s in config["domains"].items()),
                              *(("distillation.domains", d, s) for d, s in training_domains)]:
        for entry in spec["sources"]:
            if entry["set"] not in config["prompt_sources"]:
                raise ConfigError(f"config key '{key}.{domain}.sources': prompt set {entry['set']!r} is not "
                                  f"defined under 'prompt_sources' (defined: {sorted(config['prompt_sources'])})")
    for name in (config.get("distribution_check") or {}).get("drafts") or []:
        if name not in config["drafts"] and name not in kinds or kind_of(name) not in ("model", "truncated"):
            raise ConfigError(f"config key 'distribution_check.drafts': {name!r} is not a draft (under 'drafts' or "
                              "'draft_kinds') that loads a model (kind 'model' or 'truncated')")
    for name in (config.get("profiling") or {}).get("extra_models") or []:
        if name not in models:
            raise ConfigError(f"config key 'profiling.extra_models': {name!r} is not under 'models'")
    peers = config.get("peers") or {}
    for name in peers.get("drafts") or []:
        if name not in config["drafts"] and name not in kinds or kind_of(name) != "model":
            raise ConfigError(f"config key 'peers.drafts': {name!r} is not a draft (under 'drafts' or 'draft_kinds') "
                              "of kind 'model' (assisted generation takes a model)")
    for domain in peers.get("domains") or []:
        if domain not in config["domains"]:
            raise ConfigError(f"config key 'peers.domains': {domain!r} is not under 'domains'")
    sweep = config.get("draft_sweep") or {}
    for name in sweep.get("drafts") or []:
        if name not in models and name not in kinds:
            raise ConfigError(f"config key 'draft_sweep.drafts': {name!r} is neither under 'models' nor under "
                              f"'draft_kinds' (defined: {sorted([*models, *kinds])})")
    for name, override in (sweep.get("per_draft") or {}).items():
        if name not in (sweep.get("drafts") or []):
            raise ConfigError(f"config key 'draft_sweep.per_draft.{name}': {name!r} is not under 'draft_sweep.drafts'")
    for key, domains in [("draft_sweep.domains", sweep.get("domains") or []),
                         *((f"draft_sweep.per_draft.{n}.domains", o.get("domains") or [])
                           for n, o in (sweep.get("per_draft") or {}).items())]:
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


def validate_config(config: dict) -> None:
    check_schema(config)
    check_config_semantics(config)
