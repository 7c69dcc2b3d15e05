# Helpers shared by the rules: the config's cross-reference checks, the study's job list, input functions.
import itertools
import re

from specdec.config import check_config_semantics
from specdec.prompts import domain_source_sets, source_file_name


check_config_semantics(config)

DECODING = config["decoding"]
RUNTIME = config.get("runtime", {})
PROFILING = config.get("profiling") or {}

# Truncated drafts get their model directory from their own rule (derive_truncated_draft).
TRUNCATED_DRAFTS = [n for n, s in config.get("draft_kinds", {}).items() if s["kind"] == "truncated"]
TRUNCATED_DRAFTS_PATTERN = "|".join(map(re.escape, TRUNCATED_DRAFTS)) or "no-truncated-draft"
# Distilled drafts: their model directory comes from distill_draft (workflow/rules/distill.smk).
DISTILLED_DRAFTS = [n for n, s in config.get("draft_kinds", {}).items() if s["kind"] == "distilled"]
OWN_MODEL_KINDS = ("truncated", "distilled")  # draft kinds whose model directory the workflow makes

wildcard_constraints:
    model="|".join(map(re.escape, config["models"])),
    # Any defined draft: the study runs those under `drafts`; peers and the distribution check may name others.
    draft="|".join(map(re.escape, dict.fromkeys([*config["drafts"], *config.get("draft_kinds", {})]))),
    derived=TRUNCATED_DRAFTS_PATTERN,
    distilled="|".join(map(re.escape, DISTILLED_DRAFTS)) or "no-distilled-draft",
    domain="|".join(map(re.escape, config["domains"])),
    setting="greedy|sampled",
    profiled="|".join(map(re.escape, list(config["models"]) + TRUNCATED_DRAFTS + DISTILLED_DRAFTS)),
    k=r"\d+",
    seed=r"\d+",


def model_dir(name):
    return f"resources/models/{name}"


def draft_spec(name):
    """A draft: a model of `models` (kind 'model') or an entry of `draft_kinds`."""
    if name in config["models"]:
        return {"kind": "model", "model": name}
    return dict(config["draft_kinds"][name])


def study_model_dirs():
    """The model directories the study decodes with: the target and every draft that loads a model."""
    dirs = [model_dir(config["target"])]
    for name in config["drafts"]:
        spec = draft_spec(name)
        if spec["kind"] in ("model", *OWN_MODEL_KINDS):
            dirs.append(model_dir(spec["model"] if spec["kind"] == "model" else name))
    return list(dict.fromkeys(dirs))


def draft_model_input(wildcards):
    """The prepared model directory a draft loads, if it loads one."""
    spec = draft_spec(wildcards.draft)
    if spec["kind"] == "model":
        return {"draft": model_dir(spec["model"])}
    if spec["kind"] in OWN_MODEL_KINDS:
        return {"draft": model_dir(wildcards.draft)}
    return {}


def decode_jobs(setting=None):
    """(setting, draft, domain, k, seed) of every decoding job the config asks for."""
    jobs = []
    if DECODING.get("greedy", True):
        jobs += [("greedy", d, dom, k, 0) for d, dom, k in
                 itertools.product(config["drafts"], config["domains"], DECODING["k"])]
    sampled = DECODING.get("sampled")
    if sampled:
        ks = sampled.get("k") or DECODING["k"]
        jobs += [("sampled", d, dom, k, s) for d, dom, k, s in
                 itertools.product(config["drafts"], config["domains"], ks, sampled["seeds"])]
    return [j for j in jobs if setting is None or j[0] == setting]


def run_files(name, setting=None):
    """The `name` file (steps.parquet / sequences.parquet) of every decoding job."""
    return [f"results/runs/{s}/{d}/{dom}/k{k}/seed{seed}/{name}" for s, d, dom, k, seed in decode_jobs(setting)]


def sampling_params(wildcards):
    if wildcards.setting == "greedy":
        return {"temperature": 0.0, "top_k": None, "top_p": None}
    sampled = DECODING["sampled"]
    return {"temperature": float(sampled["temperature"]), "top_k": sampled.get("top_k"),
            "top_p": sampled.get("top_p")}


def prompt_inputs(wildcards):
    spec = config["domains"][wildcards.domain]
    files = {s: f"resources/prompt_sources/{source_file_name(s, config['prompt_sources'][s])}"
             for s in domain_source_sets(spec)}
    return files | {"tokenizer": model_dir(config["target"])}


DISTRIBUTION = config.get("distribution_check") or None


def distribution_drafts():
    """Drafts the distribution check runs on: distribution_check.drafts, else every draft that is a separate model."""
    named = (DISTRIBUTION or {}).get("drafts")
    return named if named is not None else [d for d in config["drafts"] if draft_spec(d)["kind"] == "model"]


def distribution_files():
    return [f"results/verify/distribution/{d}/{dom}.parquet" for d in distribution_drafts() for dom in config["domains"]]
