# Helpers shared by the rules: semantic config checks the schema cannot express, and the study's job list.
import itertools
import re

from specdec.prompts import domain_source_sets, source_file_name


def check_config_semantics(config):
    """Cross-references the JSON schema cannot check; each message names the offending key."""
    models = config["models"]
    for role, names in [("target", [config["target"]]), ("drafts", config["drafts"])]:
        for name in names:
            if name not in models:
                raise ValueError(f"config key '{role}': model {name!r} is not defined under 'models' "
                                 f"(defined: {sorted(models)})")
    if config["target"] in config["drafts"]:
        raise ValueError(f"config key 'drafts': {config['target']!r} is the target itself")
    for domain, spec in config["domains"].items():
        for entry in spec["sources"]:
            if entry["set"] not in config["prompt_sources"]:
                raise ValueError(f"config key 'domains.{domain}.sources': prompt set {entry['set']!r} is not "
                                 f"defined under 'prompt_sources' (defined: {sorted(config['prompt_sources'])})")
    sampled = config["decoding"].get("sampled")
    if sampled and not config["decoding"].get("greedy", True) and not sampled.get("seeds"):
        raise ValueError("config key 'decoding': neither a greedy nor a sampled setting is enabled")


check_config_semantics(config)

DECODING = config["decoding"]
RUNTIME = config.get("runtime", {})

wildcard_constraints:
    model="|".join(map(re.escape, config["models"])),
    draft="|".join(map(re.escape, config["drafts"])),
    domain="|".join(map(re.escape, config["domains"])),
    setting="greedy|sampled",
    k=r"\d+",
    seed=r"\d+",


def model_dir(name):
    return f"resources/models/{name}"


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
