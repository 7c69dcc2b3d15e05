"""The command line (`python -m specdec generate`) on tiny prepared model directories."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec import testing
from specdec.cli import main
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
    assert "loaded draft" in captured.err and "(bfloat16)" in captured.err
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    assert out["tokens_per_pass"] > 1.0  # the bf16 copy of the perturbed draft still agrees with the target


def test_draft_layers_of_a_model_directory_keep_greedy_identity(dirs, capsys):
    """--draft-layers without --draft: the target's own first layer (early exit), sharing its weights."""
    assert main(_args(dirs, "--k", "3", "--json", "--baseline", "--draft-layers", "1", draft=None)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "speculative" and out["weights"] == "safetensors"
    assert out["greedy_identical"] is True and out["tokens"] == out["baseline_tokens"]
    assert main(_args(dirs, "--draft-layers", "3")) == 2
    assert "has 2 layers" in capsys.readouterr().err


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


def test_a_gguf_target_with_a_model_directory_draft_exits_2(ggufs, dirs, capsys):
    assert main(["generate", "--target", ggufs["target"], "--draft", dirs["draft"], "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "both GGUF files" in err and ggufs["target"] in err and dirs["draft"] in err
