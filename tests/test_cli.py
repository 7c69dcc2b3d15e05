"""The command line (`python -m specdec generate`) on tiny prepared model directories and tiny GGUF files: every
draft kind of the registry through the front door for loading (specdec.load), refusals by the registry's own words."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import toy_draft  # noqa: F401  (registers the toy kind: the CLI runs it through --plugin, as any kind of one's own)
from specdec import testing
from specdec.cli import DRAFT_KEY, main
from specdec.drafts import check_spec, get_kind, kind_names
from specdec.drafts.registry import gguf_draft_source
from specdec.errors import DraftSpecError, InvalidModelDirError, VocabularyMismatchError
from specdec.study.prepare.models import prepare_model
from specdec.testing import TINY_VOCAB, perturbed_copy, tiny_qwen2

V = TINY_VOCAB
CHARS = testing.CHARS


def _tokenizer(chars):
    return testing.tiny_tokenizer(chars)


def _prepared(root: Path, name: str, model, tok) -> str:
    src = root / f"{name}-src"
    model.save_pretrained(src, safe_serialization=True)
    tok.save_pretrained(src)
    out = root / name
    prepare_model({"source": "local", "path": str(src)}, out, root / "downloads", log=lambda msg: None)
    return str(out)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-models")
    target = tiny_qwen2(vocab_size=V, dtype=torch.float32)
    draft = perturbed_copy(target, noise=0.05)
    other = CHARS[:-1] + ["8"]  # same size, one different string: only the tokenizer check can catch it
    return {
        "target": _prepared(root, "target", target, _tokenizer(CHARS)),
        "draft": _prepared(root, "draft", draft, _tokenizer(CHARS)),
        "other": _prepared(root, "other", draft, _tokenizer(other)),
        "missing": str(root / "nope"),
    }


def _args(dirs, *extra, draft="draft"):
    base = ["generate", "--target", dirs["target"], "--prompt", "hello world", "--max-new-tokens", "12",
            "--threads", "1"]
    return base + (["--draft", dirs[draft]] if draft else []) + list(extra)


def test_json_speculative_matches_baseline_at_temperature_zero(dirs, capsys):
    assert main(_args(dirs, "--k", "3", "--json", "--baseline")) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("tokens", "text", "acceptance", "tokens_per_pass", "n_tokens", "target_passes", "total_seconds",
                "baseline_seconds", "speedup", "baseline_tokens"):
        assert key in out, key
    assert out["n_tokens"] == len(out["tokens"]) == 12
    assert out["tokens"] == out["baseline_tokens"]
    assert out["greedy_identical"] is True
    assert 0.0 <= out["acceptance"] <= 1.0
    assert out["tokens_per_pass"] > 1.0  # the draft is a slightly perturbed copy of the target


def test_bf16_draft_keeps_greedy_identity(dirs, capsys):
    assert main(_args(dirs, "--k", "3", "--json", "--baseline", "--draft-dtype", "bfloat16")) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "loaded draft model (" in captured.err and "dtype=bfloat16" in captured.err
    assert out["draft"] == {"kind": "model", "model": dirs["draft"], "dtype": "bfloat16"}
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    assert out["tokens_per_pass"] > 1.0  # the bf16 copy of the perturbed draft still agrees with the target


def test_draft_layers_of_a_model_directory_keep_greedy_identity(dirs, capsys):
    """--draft-layers without --draft: the target's own first layer (early exit), sharing its weights; with --draft:
    the draft directory's first layer (truncated, cut at load as the gguf regime cuts a file)."""
    assert main(_args(dirs, "--k", "3", "--json", "--baseline", "--draft-layers", "1", draft=None)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "speculative" and out["weights"] == "safetensors"
    assert out["draft"] == {"kind": "early_exit", "layers": 1}
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    assert main(_args(dirs, "--k", "3", "--json", "--baseline", "--draft-layers", "1")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["draft"] == {"kind": "truncated", "model": dirs["draft"], "layers": 1}
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    assert main(_args(dirs, "--draft-layers", "3")) == 2
    assert "--draft-layers 3: " + dirs["draft"] + " has 2 layers" in capsys.readouterr().err


def test_sampling_and_baseline_only(dirs, capsys):
    assert main(_args(dirs, "--json", "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "3")) == 0
    sampled = json.loads(capsys.readouterr().out)
    assert sampled["n_tokens"] == 12
    assert main(_args(dirs, "--json", draft=None)) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["mode"] == "baseline" and plain["target_passes"] == plain["n_tokens"] == 12


def test_text_mode_prints_text_to_stdout(dirs, capsys):
    assert main(_args(dirs, "--no-chat-template")) == 0
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "{" not in captured.out
    assert "acceptance" in captured.err  # statistics go to stderr


def test_vocabulary_mismatch_exits_2_naming_both(dirs, capsys):
    assert main(_args(dirs, draft="other")) == 2
    err = capsys.readouterr().err
    assert dirs["target"] in err and dirs["other"] in err and "vocabular" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("extra, message", [
    (["--k", "0"], "--k"),
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--k", "two"], "--k"),
])
def test_bad_arguments_exit_2(dirs, capsys, extra, message):
    assert main(_args(dirs, *extra)) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


def test_missing_model_dir_exits_2(dirs, capsys):
    assert main(["generate", "--target", dirs["missing"], "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert dirs["missing"] in err and len(err.strip().splitlines()) == 1


def test_python_dash_m(dirs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "specdec", *_args(dirs, "--json")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["tokens"]) == 12 and isinstance(out["text"], str)


# --- GGUF files: the CPU user's entry point (the quantized engine, the tokenizer read from the target's file) --------
needs_product = pytest.mark.skipif(not importlib.import_module("specdec.gguf.quant").available(),
                                   reason="specdec.native._quant (the quantized product) not built")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-gguf")
    text = root / "text.gguf"
    text.write_text("not a model")
    scales = testing.GGUF_TARGET_SCALES
    return {
        "target": str(testing.tiny_gguf_with_tokenizer(root / "target.gguf", layers=2, norm_scale=scales)),
        # the target's first layer, embedding and head (tiny_gguf draws each tensor from its name): often right
        "draft": str(testing.tiny_gguf_with_tokenizer(root / "draft.gguf", layers=1, norm_scale=scales[:1])),
        "q4_0": str(testing.tiny_gguf_with_tokenizer(root / "q4_0.gguf", layers=1, types={"ffn_down": "Q4_0"})),
        "other": str(testing.tiny_gguf_with_tokenizer(root / "other.gguf", layers=1,
                                                      tokenizer=_tokenizer(CHARS[:-1] + ["8"]))),
        "text": str(text),
        "missing": str(root / "missing.gguf"),
    }


def _gguf_args(ggufs, *extra, draft="draft"):
    base = ["generate", "--target", ggufs["target"], "--prompt", "hello world", "--max-new-tokens", "12",
            "--threads", "1"]
    return base + (["--draft", ggufs[draft]] if draft else []) + list(extra)


@needs_product
@pytest.mark.parametrize("extra, draft", [([], "draft"),  # a model draft from its own file
                                          (["--draft-layers", "1"], None),  # early exit: the target's first layer
                                          (["--draft-layers", "1"], "target")])  # a truncated cut of a file
def test_gguf_files_run_speculative_decoding_equal_to_greedy(ggufs, capsys, extra, draft):
    assert main(_gguf_args(ggufs, "--k", "3", "--json", "--baseline", *extra, draft=draft)) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["weights"] == "gguf" and out["mode"] == "speculative"
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"] and out["n_tokens"] == 12
    assert out["tokens_per_pass"] > 1.5  # the draft is the target's dominant first layer
    assert "GGUF: Q4_K, Q6_K" in captured.err and "read the tokenizer of" in captured.err
    assert "(chat template)" in captured.err  # the file's chat template came with its tokenizer


@needs_product
def test_gguf_sampling_and_plain_decoding(ggufs, capsys):
    assert main(_gguf_args(ggufs, "--json", "--temperature", "0.8", "--top-k", "20", "--seed", "3")) == 0
    sampled = json.loads(capsys.readouterr().out)
    assert sampled["mode"] == "speculative" and len(sampled["tokens"]) == 12
    assert main(_gguf_args(ggufs, "--no-chat-template", draft=None)) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "chat template" not in captured.err


@pytest.mark.parametrize("draft, extra, words", [
    ("q4_0", [], ["q4_0.gguf", "blk.0.ffn_down.weight (Q4_0)"]),
    ("other", [], ["target.gguf", "other.gguf", "vocabular", "['7']", "['8']"]),
    ("text", [], ["text.gguf", "not a GGUF file"]),
    ("missing", [], ["missing.gguf", "no GGUF file"]),
    ("draft", ["--dtype", "bfloat16"], ["--dtype", "not for GGUF files"]),
    ("draft", ["--linear-kernel", "auto"], ["--linear-kernel", "not for GGUF files"]),
    ("draft", ["--draft-layers", "2"], ["--draft-layers 2", "draft.gguf has 1 layers"]),
])
def test_gguf_files_that_cannot_run_exit_2_naming_the_file_before_any_model_loads(ggufs, capsys, draft, extra, words):
    assert main(_gguf_args(ggufs, *extra, draft=draft)) == 2
    captured = capsys.readouterr()
    assert all(word in captured.err for word in words), captured.err
    # no progress line at all: refused before the tokenizer or any model was read
    assert "specdec:" not in captured.err and "Traceback" not in captured.err and captured.out == ""


@needs_product
def test_the_argmax_head_gives_the_same_greedy_tokens(ggufs, capsys):
    assert main(_gguf_args(ggufs, "--k", "3", "--json", "--baseline", "--argmax-head")) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"] and out["n_tokens"] == 12


ARGMAX_HEAD_ON = "the exact argmax head: on"


@needs_product
def test_greedy_gguf_decoding_runs_the_argmax_head_by_default_and_not_where_it_does_not_apply(ggufs, tmp_path, capsys):
    q8_head = testing.tiny_gguf_with_tokenizer(tmp_path / "q8.gguf", types=testing.DRAFT_TYPES, layers=1)
    runs = {"default": _gguf_args(ggufs, "--k", "2", "--json", "--baseline"),
            "off": _gguf_args(ggufs, "--k", "2", "--json", "--baseline", "--no-argmax-head"),
            "sampling": _gguf_args(ggufs, "--json", "--temperature", "0.8", "--seed", "1"),
            "q8_0 head": ["generate", "--target", str(q8_head), "--prompt", "hi", "--max-new-tokens", "4",
                          "--threads", "1", "--json"]}
    said = {}
    for name, argv in runs.items():
        assert main(argv) == 0, name
        captured = capsys.readouterr()
        said[name] = ARGMAX_HEAD_ON in captured.err
        if name in ("default", "off"):
            out = json.loads(captured.out)
            assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"], name
    assert said == {"default": True, "off": False, "sampling": False, "q8_0 head": False}


@pytest.mark.parametrize("target, extra, words", [
    ("gguf", ["--temperature", "0.7"], ["--argmax-head", "greedy decoding (--temperature 0)", "0.7"]),
    ("dir", [], ["--argmax-head", "must be a .gguf file"]),
])
def test_the_argmax_head_outside_greedy_gguf_decoding_exits_2(ggufs, dirs, capsys, target, extra, words):
    path = ggufs["target"] if target == "gguf" else dirs["target"]
    assert main(["generate", "--target", path, "--prompt", "hi", "--argmax-head", *extra]) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err


def test_a_gguf_target_with_a_model_directory_draft_exits_2(ggufs, dirs, capsys):
    assert main(["generate", "--target", ggufs["target"], "--draft", dirs["draft"], "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "both GGUF files" in err and ggufs["target"] in err and dirs["draft"] in err


# --- every kind of the registry, as the registry describes it -------------------------------------------------------
KINDS = kind_names()
LOOKUP_PROMPT = "abcabcabcabc"  # repeats: the lookup kinds find matches in the prompt itself


def _smallest(schema: dict):
    """The smallest value a required field's schema allows (required fields besides `model` are numbers)."""
    return {"integer": schema.get("minimum", 1), "number": schema.get("minimum", 0.0)}[schema["type"]]


def _kind_spec(kind_name: str, model_path: str) -> dict:
    """The spec the CLI runs for a kind: its `model` field (where it has one) the --draft path, its required fields
    at their smallest values."""
    kind = get_kind(kind_name)
    spec = {"kind": kind_name, **({"model": model_path} if "model" in kind.fields else {})}
    return {**spec, **{field: _smallest(kind.fields[field]) for field in kind.required if field != "model"}}


def _kind_options(spec: dict, model_path: str, own_dirs: dict) -> list[str]:
    """The options that ask for `spec`: the kind's module (--plugin), a --draft where the kind loads a model (a
    directory of its own kind where it loads its own kind of model), its fields as --draft-option."""
    kind = get_kind(spec["kind"])
    options = ["--plugin", kind.build.__module__, "--draft-kind", spec["kind"]]
    if kind.model is not None:
        options += ["--draft", own_dirs[spec["kind"]] if kind.load is not None else model_path]
    return options + [item for field, value in spec.items() if field not in ("kind", "model")
                      for item in ("--draft-option", f"{field}={value}")]


def _own_models(target, root: Path) -> dict[str, str]:
    """A directory of its own kind for each kind that loads one (a feature head): an untrained one made for
    `target`, as its training starts it."""
    dirs = {}
    for name in KINDS:
        if get_kind(name).load is not None:
            get_kind(name).untrained({"kind": name}, target).save(root / name)
            dirs[name] = str(root / name)
    return dirs


@pytest.fixture(scope="module")
def own_dirs(dirs, tmp_path_factory):
    from specdec.fp32.loading import load_model

    return _own_models(load_model(dirs["target"])[0], tmp_path_factory.mktemp("cli-own"))


def _kind_args(target: str, *options) -> list[str]:
    return ["generate", "--target", target, "--prompt", LOOKUP_PROMPT, "--no-chat-template", "--max-new-tokens", "12",
            "--threads", "1", "--k", "3", "--json", "--baseline", *options]


@pytest.mark.parametrize("kind_name", KINDS)
def test_every_kind_runs_from_the_command_line_equal_to_greedy(dirs, own_dirs, capsys, kind_name):
    spec = _kind_spec(kind_name, dirs["draft"])
    assert main(_kind_args(dirs["target"], *_kind_options(spec, dirs["draft"], own_dirs))) == 0, \
        capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["draft"] == spec and out["mode"] == "speculative"  # the kind ran with the fields asked for
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"] and out["n_tokens"] == 12
    assert out["drafted"] > 0  # and it proposed


@pytest.mark.parametrize("kind_name", KINDS)
def test_every_kind_runs_in_fixed_shape_sessions_equal_to_greedy(dirs, own_dirs, capsys, kind_name):
    """--session fixed (issue 48): the target, a draft's model and the target's own first layers in FixedShapeLMs
    (every pass 4 rows here, so a k-3 verify pass fills one); greedy identity for every kind."""
    spec = _kind_spec(kind_name, dirs["draft"])
    args = _kind_args(dirs["target"], *_kind_options(spec, dirs["draft"], own_dirs), "--session", "fixed",
                      "--session-rows", "4", "--linear-kernel", "default")
    assert main(args) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["draft"] == spec and out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    assert out["drafted"] > 0 and out["session"]["kind"] == "fixed" and out["session"]["rows"] == 4


@pytest.mark.parametrize("options, message", [
    (["--session", "fixed"], "linear_kernel 'invariant' swaps in the native attention"),  # the CPU default kernel
    (["--session", "fixed", "--linear-kernel", "default", "--session-rows", "0"], "session_rows must be a positive"),
])
def test_a_fixed_session_that_cannot_work_is_refused_in_one_line(dirs, capsys, options, message):
    assert main(_kind_args(dirs["target"], *options)) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_help_lists_every_registered_kind_without_importing_torch(capsys):
    code = ("import json, sys\nfrom specdec.cli import main\nfrom specdec.drafts import kind_names\n"
            "code = main(['generate', '--help'])\n"
            "print(json.dumps({'code': code, 'kinds': kind_names(), 'torch': 'torch' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    *lines, last = proc.stdout.strip().splitlines()
    result = json.loads(last)
    assert result["code"] == 0 and result["torch"] is False, proc.stderr[-2000:]
    assert {line.split(":")[0].strip() for line in lines if re.match(r"^  [a-z_0-9]+: ", line)} == set(result["kinds"])
    # in this process a plugin's kind is registered before the parser is built: listed too
    assert main(["generate", "--help"]) == 0
    assert f"  {toy_draft.KIND}: " in capsys.readouterr().out


@pytest.mark.parametrize("options, spec", [
    (["--draft-kind", "medusa"], {"kind": "medusa"}),
    (["--draft-kind", "prompt_lookup", "--draft-option", "ngram_maxx=3"], {"kind": "prompt_lookup", "ngram_maxx": 3}),
    (["--draft-kind", "prompt_lookup", "--draft-option", "ngram_max=two"],
     {"kind": "prompt_lookup", "ngram_max": "two"}),
    (["--draft-kind", "prompt_lookup", "--draft-option", "ngram_max=0"], {"kind": "prompt_lookup", "ngram_max": 0}),
    (["--draft-kind", "early_exit"], {"kind": "early_exit"}),  # its required field missing
    (["--draft-layers", "1", "--draft-dtype", "bfloat16"], {"kind": "early_exit", "layers": 1, "dtype": "bfloat16"}),
    (["--draft-kind", "hybrid", "--draft", "DRAFT", "--draft-option", "min_confidence=-1"],
     {"kind": "hybrid", "model": "DRAFT", "min_confidence": -1}),
    (["--draft-kind", "hybrid", "--draft", "DRAFT", "--draft-option", "model_k=0"],
     {"kind": "hybrid", "model": "DRAFT", "model_k": 0}),
    (["--draft-kind", "hybrid", "--draft", "DRAFT", "--draft-option", "defer_prefill=later"],
     {"kind": "hybrid", "model": "DRAFT", "defer_prefill": "later"}),
    (["--draft-kind", "hybrid", "--draft", "DRAFT", "--draft-option", "head_type=q4_k"],
     {"kind": "hybrid", "model": "DRAFT", "head_type": "q4_k"}),
    (["--draft", "DRAFT", "--draft-option", "prompt_window=0"],
     {"kind": "model", "model": "DRAFT", "prompt_window": 0}),
    (["--draft", "DRAFT", "--draft-option", "prompt_window=1.5"],
     {"kind": "model", "model": "DRAFT", "prompt_window": 1.5}),
])
def test_bad_kinds_and_fields_are_refused_with_the_registry_s_own_error(dirs, capsys, options, spec):
    options = [dirs["draft"] if option == "DRAFT" else option for option in options]
    spec = {key: dirs["draft"] if value == "DRAFT" else value for key, value in spec.items()}
    with pytest.raises(DraftSpecError) as refusal:
        check_spec(spec, DRAFT_KEY)
    assert main(_args(dirs, *options, draft=None)) == 2
    captured = capsys.readouterr()
    assert captured.err == f"specdec generate: error: {refusal.value}\n" and captured.out == ""  # before any load


def test_a_draft_spec_file_with_options_over_it(dirs, tmp_path, capsys):
    spec_file = tmp_path / "hybrid.yaml"
    spec_file.write_text("{kind: hybrid, ngram_max: 2, ngram_min: 2}\n")
    assert main(_args(dirs, "--draft-spec", str(spec_file), "--draft-option", "ngram_max=4", "--k", "3", "--json",
                      "--baseline")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["draft"] == {"kind": "hybrid", "model": dirs["draft"], "ngram_max": 4, "ngram_min": 2}
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    spec_file.write_text("kind: hybrid\nngram_max: 3.5\n")  # a field of the wrong type, in the file
    with pytest.raises(DraftSpecError) as refusal:
        check_spec({"kind": "hybrid", "model": dirs["draft"], "ngram_max": 3.5}, DRAFT_KEY)
    assert main(_args(dirs, "--draft-spec", str(spec_file))) == 2
    assert capsys.readouterr().err == f"specdec generate: error: {refusal.value}\n"


@pytest.mark.parametrize("options, words", [
    (["--draft-kind", "prompt_lookup", "--draft", "DRAFT"], ["a 'prompt_lookup' draft loads no model", "drop --draft"]),
    (["--draft-kind", "hybrid"], ["a 'hybrid' draft loads a model", "--draft PATH"]),
    (["--draft-kind", "hybrid", "--draft", "DRAFT", "--draft-option", "model=x"], ["the draft field 'model'"]),
    (["--draft-option", "ngram_max"], ["--draft-option 'ngram_max': KEY=VALUE"]),
    (["--draft-option", "kind=hybrid"], ["give the kind with --draft-kind"]),
    (["--draft-option", "ngram_max=3"], ["draft fields ['ngram_max'] but no draft"]),
    (["--draft-spec", "MISSING"], ["--draft-spec", "nope", "No such file"]),
    (["--plugin", "no_such_plugin", "--draft-kind", "prompt_lookup"], ["config key 'plugins'", "no_such_plugin"]),
    (["--draft-kind", "feature_head", "--draft", "MISSING"], ["nope holds no feature head"]),
])
def test_draft_options_that_cannot_work_exit_2_with_one_line(dirs, capsys, options, words):
    options = [{"DRAFT": dirs["draft"], "MISSING": dirs["missing"]}.get(option, option) for option in options]
    assert main(_args(dirs, *options, draft=None)) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith("specdec generate: error: ") and all(word in err for word in words), captured.err
    assert captured.out == "" and "Traceback" not in captured.err


# --- the front door the CLI goes through (specdec.load) ------------------------------------------------------------
def test_the_front_door_checks_paths_and_vocabularies_before_loading(dirs, ggufs):
    from specdec.load import check_model, check_same_vocabularies

    target, other = check_model(dirs["target"]), check_model(dirs["other"])
    assert (target.weights, target.layers, target.header) == ("safetensors", 2, None)
    with pytest.raises(InvalidModelDirError, match="nope has no manifest.json"):
        check_model(dirs["missing"])
    with pytest.raises(VocabularyMismatchError, match="different vocabularies"):
        check_same_vocabularies(target, other)
    check_same_vocabularies(target, check_model(dirs["draft"]))
    gguf = check_model(ggufs["target"])
    assert (gguf.weights, gguf.layers) == ("gguf", 2) and gguf.header.tensors
    with pytest.raises(ValueError, match="both GGUF files"):
        check_same_vocabularies(gguf, target)
    with pytest.raises(VocabularyMismatchError):
        check_same_vocabularies(gguf, check_model(ggufs["other"]))


def test_a_truncated_spec_over_a_deeper_directory_runs_its_first_layers(dirs):
    from specdec.drafts import early_exit_model
    from specdec.load import load_draft_model
    from specdec.runtime import Runtime

    def load(layers: int | None):
        spec = {"kind": "model", "model": "d"} if layers is None else {"kind": "truncated", "model": "d",
                                                                        "layers": layers}
        return load_draft_model("d", spec, dirs["draft"], testing.tiny_tokenizer(), Runtime())

    whole, cut = load(None), load(1)
    assert whole.config.num_hidden_layers == 2 and cut.config.num_hidden_layers == len(cut.model.layers) == 1
    ids = torch.tensor([[3, 5, 7]])
    with torch.no_grad():  # the directory's first layer with its norm and head
        assert torch.equal(cut(ids).logits, early_exit_model(whole, 1)(ids).logits)
    assert load(2).config.num_hidden_layers == 2  # the study's truncated directories: loaded as they are
    with pytest.raises(DraftSpecError, match="layers 3 is not within 1..2"):
        load(3)


@pytest.fixture(scope="module")
def gguf_own_dirs(ggufs, tmp_path_factory):
    from specdec.load import load_target
    from specdec.runtime import Runtime

    return _own_models(load_target(ggufs["target"], Runtime(weights="gguf"))[0], tmp_path_factory.mktemp("gguf-own"))


@needs_product
@pytest.mark.parametrize("kind_name", KINDS)
def test_every_kind_runs_on_gguf_files_equal_to_greedy_or_is_refused_by_the_registry(ggufs, gguf_own_dirs, capsys,
                                                                                      kind_name):
    """Each kind as the gguf regime runs it (its model from a GGUF file, cut to its first layers, the target's own
    layers, a head of its own); a kind whose weights have no GGUF file is refused with the registry's words."""
    spec = _kind_spec(kind_name, ggufs["draft"])
    args = _kind_args(ggufs["target"], *_kind_options(spec, ggufs["draft"], gguf_own_dirs))
    kind = get_kind(kind_name)
    if kind.model == "own" and not kind.gguf_cut and kind.load is None:
        with pytest.raises(DraftSpecError) as refusal:
            gguf_draft_source(ggufs["draft"], spec)
        assert main(args) == 2
        assert capsys.readouterr().err == f"specdec generate: error: {refusal.value}\n"
        return
    assert main(args) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["draft"] == spec and out["weights"] == "gguf" and out["mode"] == "speculative"
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    assert out["drafted"] > 0
