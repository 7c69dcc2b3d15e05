"""The gguf regime (runtime.weights: gguf) from a GGUF path to a decoding job: the header read alone (the same
tensor table and data offset as the gguf package's reader), refusals by name before any tensor is read (missing
file, not GGUF, not qwen2, a tensor type the kernel does not run, no vocabulary, vocabularies that differ), the
tokenizer from the file, the runtime setting's own checks, drafts through the registry (which GGUF file and how many
layers; distilled drafts and a draft dtype refused, naming the draft), weights shared between a target and its cuts,
and a study decoding job whose greedy runs report 0 near-ties: a divergence here is a bug, never diagnosed away."""

import math

import pandas as pd
import pytest
import torch

from specdec.gguf import loading as gguf_loading, quant
from specdec.errors import DraftSpecError, VocabularyMismatchError
from specdec.drafts.registry import gguf_draft_source
from specdec.gguf.header import GGUFFileError, read_header
from specdec.gguf.loading import (GGUFVocabulary, check_gguf, load_gguf_draft, load_gguf_for_decoding,
                                  load_gguf_tokenizer)
from specdec.gguf.model import GGUFModelError
from specdec.gguf.lean import LeanLM
from specdec.fp32.loading import load_for_decoding
from specdec.load import make_draft
from specdec.runtime import Runtime
from specdec.gguf.quant import UnsupportedTensorType
from specdec.study.decoding.jobs import DecodeJob, run_decode_jobs
from specdec.testing import (CHARS, GGUF_TARGET_SCALES, add_gguf_metadata, gguf_tokenizer_fields, tiny_gguf,
                             tiny_gguf_with_tokenizer, tiny_tokenizer)

GGUF = Runtime(weights="gguf", threads=1)
needs_product = pytest.mark.skipif(not quant.available(),
                                   reason="specdec.native._quant (the quantized product) not built")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-regime")
    text = root / "notes.gguf"
    text.write_text("not a model")
    return {
        "target": tiny_gguf_with_tokenizer(root / "target.gguf", layers=2, norm_scale=GGUF_TARGET_SCALES),
        "draft": tiny_gguf_with_tokenizer(root / "draft.gguf", layers=1, norm_scale=GGUF_TARGET_SCALES[:1]),
        # one tensor of a type the kernel does not run, in the middle of the file
        "q4_0": tiny_gguf_with_tokenizer(root / "q4_0.gguf", layers=2, types={"blk.1.ffn_up": "Q4_0"}),
        # the same size of vocabulary, one string different: only a comparison of the strings catches it
        "other": tiny_gguf_with_tokenizer(root / "other.gguf", layers=1, tokenizer=tiny_tokenizer(CHARS[:-1] + ["8"])),
        "no-vocabulary": tiny_gguf(root / "no-vocabulary.gguf", layers=1),
        "llama": tiny_gguf_with_tokenizer(root / "llama.gguf", layers=1, architecture="llama"),
        "text": text,
        "missing": root / "missing.gguf",
    }


# --- the header -------------------------------------------------------------------------------------------------------
def test_the_header_reader_reads_what_the_gguf_package_reads(files):
    from gguf import GGUFReader

    for name in ("target", "q4_0", "no-vocabulary"):
        header, reader = read_header(files[name]), GGUFReader(files[name])
        assert {name: (t.qtype, t.shape) for name, t in header.tensors.items()} == {
            t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors}
        assert header.data_start == reader.data_offset
        for key in ("general.architecture", "qwen2.block_count", "qwen2.embedding_length",
                    "tokenizer.ggml.eos_token_id"):
            assert header.metadata[key] == reader.fields[key].contents(), key
    tokens = read_header(files["target"]).metadata["tokenizer.ggml.tokens"]
    assert tokens == GGUFReader(files["target"]).fields["tokenizer.ggml.tokens"].contents()
    # arrays not asked for are walked, not kept: their length only
    assert read_header(files["target"], string_arrays=()).metadata["tokenizer.ggml.tokens"] == len(tokens)


def test_added_metadata_leaves_every_tensor_where_the_reader_finds_it(files, tmp_path):
    """add_gguf_metadata (the tests' tokenizer writer) realigns the data: the gguf package reads the same bytes."""
    from gguf import GGUFReader

    plain = tiny_gguf(tmp_path / "plain.gguf", layers=1, vocab_size=64)
    with_tokenizer = add_gguf_metadata(plain, gguf_tokenizer_fields(), dest=tmp_path / "with.gguf")
    before, after = GGUFReader(plain), GGUFReader(with_tokenizer)
    assert [t.name for t in before.tensors] == [t.name for t in after.tensors]
    assert all((a.data == b.data).all() for a, b in zip(before.tensors, after.tensors))
    with pytest.raises(ValueError, match="already has"):
        add_gguf_metadata(with_tokenizer, {"tokenizer.ggml.model": "gpt2"})


@pytest.mark.parametrize("name, error, words", [
    ("missing", FileNotFoundError, ["no GGUF file", "missing.gguf"]),
    ("text", GGUFFileError, ["not a GGUF file", "notes.gguf"]),
    ("llama", GGUFModelError, ["architecture 'llama'", "qwen2"]),
    ("q4_0", UnsupportedTensorType, ["blk.1.ffn_up.weight (Q4_0)", "1 tensors"]),
    ("no-vocabulary", GGUFFileError, ["no vocabulary", "tokenizer.ggml.tokens"]),
])
def test_a_file_the_engine_cannot_run_is_refused_by_name_before_any_tensor_is_read(files, name, error, words,
                                                                                 monkeypatch):
    def never(path):
        raise AssertionError("read_gguf was called: the refusal came after the tensors were read")

    monkeypatch.setattr(gguf_loading, "read_gguf", never)
    with pytest.raises(error) as caught:
        load_gguf_for_decoding(files[name], GGUF)
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_a_truncated_header_is_a_clear_error(files, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(files["target"].read_bytes()[:2000])  # inside the header
    with pytest.raises(GGUFFileError, match="truncated or corrupt"):
        read_header(cut)


# --- vocabulary and tokenizer -----------------------------------------------------------------------------------------
def test_the_files_tokenizer_is_the_tokenizer_it_was_written_from(files):
    tok, reference = load_gguf_tokenizer(files["target"]), tiny_tokenizer()
    assert tok.get_vocab() == reference.get_vocab() == GGUFVocabulary(check_gguf(files["target"])).get_vocab()
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == 4096  # the file's context length
    for text in ("hello world", "Write a function 0123"):
        assert tok(text).input_ids == reference(text).input_ids
    chat = [{"role": "user", "content": "hi there"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_a_draft_with_another_vocabulary_is_refused_before_its_weights_are_read(files, monkeypatch):
    target, vocabulary = load_gguf_for_decoding(files["target"], GGUF)
    monkeypatch.setattr(gguf_loading, "read_gguf", lambda path: pytest.fail("the draft's tensors were read"))
    with pytest.raises(VocabularyMismatchError) as caught:
        load_gguf_draft("odd", {"kind": "model", "model": "other"}, files["other"], target, vocabulary, GGUF)
    assert "'odd'" in str(caught.value) and "['7']" in str(caught.value) and "['8']" in str(caught.value)


# --- the runtime setting ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, words", [
    ({"weights": "gguf", "dtype": "bfloat16"}, "dtype must be 'float32'"),
    ({"weights": "gguf", "device": "cuda"}, "CPU only"),
    ({"weights": "ggml"}, "runtime weights must be one of"),
])
def test_the_runtime_refuses_what_has_no_meaning_for_gguf_weights(settings, words):
    with pytest.raises(ValueError, match=words):
        Runtime(**settings)


def test_each_loader_refuses_the_other_regimes_weights(files):
    with pytest.raises(ValueError, match="load_gguf_for_decoding"):
        load_for_decoding(files["target"], GGUF)
    with pytest.raises(ValueError, match="runtime weights 'gguf'"):
        load_gguf_for_decoding(files["target"], Runtime())


# --- drafts -----------------------------------------------------------------------------------------------------------
def test_which_file_and_layers_each_kind_runs():
    assert gguf_draft_source("d", {"kind": "model", "model": "m"}) == ("m", None)
    assert gguf_draft_source("d", {"kind": "truncated", "model": "m", "layers": 3}) == ("m", 3)
    assert gguf_draft_source("d", {"kind": "hybrid", "model": "m", "ngram_max": 2}) == ("m", None)
    assert gguf_draft_source("d", {"kind": "early_exit", "layers": 2}) is None
    assert gguf_draft_source("d", {"kind": "prompt_lookup"}) is None
    assert gguf_draft_source("d", {"kind": "model", "model": "m", "dtype": "float32"}) == ("m", None)


@pytest.mark.parametrize("spec, words", [
    ({"kind": "distilled", "model": "m", "layers": 2}, ["'my-draft'", "'distilled'", "'distill'", "no GGUF file"]),
    ({"kind": "hybrid", "model": "m", "dtype": "bfloat16"}, ["'my-draft'", "dtype 'bfloat16'", "no meaning"]),
    ({"kind": "model", "model": "m", "dtype": "bfloat16"}, ["'my-draft'", "dtype 'bfloat16'"]),
])
def test_a_draft_that_cannot_run_here_is_refused_naming_it_before_any_model_loads(files, spec, words, monkeypatch):
    monkeypatch.setattr(gguf_loading, "read_gguf", lambda path: pytest.fail("a model was read"))
    with pytest.raises(DraftSpecError) as caught:
        gguf_draft_source("my-draft", spec)
    assert all(word in str(caught.value) for word in words), str(caught.value)
    target = LeanLM.__new__(LeanLM)  # make_draft refuses before it touches the target
    with pytest.raises(DraftSpecError):
        make_draft("my-draft", spec, target, None, files["draft"], GGUF)


def test_cuts_and_early_exits_share_the_weights_they_cut(files):
    target, vocabulary = load_gguf_for_decoding(files["target"], GGUF, max_length=64)
    drafts = {name: make_draft(name, spec, target, vocabulary, path, GGUF) for name, spec, path in [
        ("cut", {"kind": "truncated", "model": "target", "layers": 1}, files["target"]),
        ("self", {"kind": "early_exit", "layers": 1}, None),
        ("whole", {"kind": "model", "model": "target"}, files["target"]),
        ("draft", {"kind": "model", "model": "draft"}, files["draft"])]}
    for name in ("cut", "self", "whole"):
        session = drafts[name].session
        assert session.model is target.model, name  # the target's weights, not a copy
        assert session is not target and session.max_length == 64  # a KV cache of its own
    assert len(drafts["cut"].session.layers) == len(drafts["self"].session.layers) == 1
    assert len(drafts["whole"].session.layers) == 2
    assert drafts["draft"].session.model is not target.model and len(drafts["draft"].session.layers) == 1
    with pytest.raises(DraftSpecError, match="layers 3 is not within 1..1"):
        make_draft("deep", {"kind": "truncated", "model": "draft", "layers": 3}, target, vocabulary, files["draft"],
                   GGUF).session


# --- a decoding job ---------------------------------------------------------------------------------------------------
JOB = DecodeJob(setting="greedy", draft="d", domain="code", k=1, seed=0, max_new_tokens=10, repeats=1)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return pd.DataFrame({"prompt_id": ["p0", "p1"],
                         "input_ids": [torch.randint(3, 64, (int(n),), generator=g).tolist() for n in (7, 12)]})


@needs_product
def test_a_greedy_job_keeps_identity_and_reports_no_near_tie(files, prompts):
    target, vocabulary = load_gguf_for_decoding(files["target"], GGUF, max_length=64)
    draft = make_draft("d", {"kind": "hybrid", "model": "draft"}, target, vocabulary, files["draft"], GGUF)
    runs = run_decode_jobs(target, draft, prompts, JOB, [1, 3], log=lambda line: None)
    for k, (steps, sequences) in runs.items():
        spec = sequences[sequences["method"] == "speculative"]
        assert spec["identical"].all() and "near_tie" not in spec  # nothing to diagnose
        assert steps["kernel"].str.startswith("gguf-").all()
        assert (steps[steps["method"] == "speculative"]["drafted"] > 0).any()


class Wrong:
    """The target's session with every row of a verify pass losing its top token: speculative decoding then differs
    from greedy decoding (one-row steps) at its first block, a bug the job must report as a divergence."""

    def __init__(self, session):
        self.session = session

    def __getattr__(self, name):
        return getattr(self.session, name)

    def extend(self, tokens, n_logits):
        logits = self.session.extend(tokens, n_logits)
        if n_logits > 1:  # a verify pass (a step and the prompt pass ask for one row)
            logits = logits.clone()
            logits[torch.arange(n_logits), logits.argmax(-1)] = -1e9
        return logits


@needs_product
def test_a_divergence_is_reported_as_one_never_as_a_near_tie(files, prompts, monkeypatch):
    """The mutation a batch-variant engine would look like: the job reports it divergent (near_tie False) without
    replaying it (the near-tie diagnosis runs Hugging Face models and finds rounding where there is none here)."""
    from specdec.study.decoding import jobs

    target, vocabulary = load_gguf_for_decoding(files["target"], GGUF, max_length=64)
    draft = make_draft("d", {"kind": "model", "model": "draft"}, target, vocabulary, files["draft"], GGUF)
    monkeypatch.setattr(jobs, "diagnose_divergence", lambda *a, **k: pytest.fail("a divergence was diagnosed"))
    monkeypatch.setattr(jobs, "_batch_invariant", lambda target: True)  # the wrapper stands for the lean target
    sequences = run_decode_jobs(Wrong(target), draft, prompts, JOB, [3], log=lambda line: None)[3][1]
    spec = sequences[sequences["method"] == "speculative"]
    assert not spec["identical"].any()
    assert (~spec["near_tie"].astype(bool)).all() and (spec["first_diff"] == 1).all()
    assert all(math.isnan(m) for m in spec["margin"])


def test_only_the_lean_engine_counts_as_batch_invariant(files):
    from specdec.study.decoding.jobs import _batch_invariant
    from specdec.testing import tiny_qwen2

    assert _batch_invariant(load_gguf_for_decoding(files["draft"], GGUF)[0])
    assert not _batch_invariant(tiny_qwen2(vocab_size=64))  # its divergences still get the near-tie diagnosis
