"""The front door for loading: a target and any registered draft kind, from prepared model directories or GGUF files,
as the command line, the study's decoding jobs and bench/ all run them.

Two regimes, told apart by `Runtime.weights` (for a path alone: its suffix, `weights_of`): prepared model directories
(safetensors, specdec.fp32.loading) or GGUF files (their own quantized tensors on the lean engine,
specdec.gguf.loading). A draft is a spec ({kind, ...fields}) that its kind builds (specdec.drafts.registry) over the
target and, where the kind loads one, a model: a prepared directory, a GGUF file, or a directory of the kind's own (a
trained feature head). `check_model` and `check_same_vocabularies` read no weights, so that a caller can refuse a
pair before anything heavy loads.

Engine code: it imports neither pandas nor the study, and nothing heavy at import (the command line checks its
arguments with it before torch loads): the engines are imported on first use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from specdec.drafts import DraftResources, get_kind
from specdec.errors import DraftSpecError
from specdec.runtime import Runtime

GGUF_SUFFIX = ".gguf"


def weights_of(path: str | os.PathLike) -> str:
    """The regime a path is loaded in: "gguf" for a *.gguf file, "safetensors" (a prepared directory) otherwise."""
    return "gguf" if str(path).lower().endswith(GGUF_SUFFIX) else "safetensors"


@dataclass(frozen=True)
class ModelInfo:
    """What a model's path says before its weights are read: its regime, its decoder layers (0 where it does not
    say), the longest sequence it takes (a GGUF file's context length; None for a directory) and, for a GGUF file,
    its header."""

    path: str
    weights: str
    layers: int
    context: int | None = None
    header: Any = None


def check_model(path: str | os.PathLike) -> ModelInfo:
    """Refuse, without reading weights, a path that cannot load: a directory that is not prepared (no manifest), a
    GGUF file the quantized engine cannot run (gguf.loading.check_gguf: names what it lacks)."""
    if weights_of(path) == "gguf":
        from specdec.gguf.loading import check_gguf

        header = check_gguf(path)
        context = header.metadata.get(f"{header.architecture}.context_length")
        return ModelInfo(str(path), "gguf", int(header.metadata.get(f"{header.architecture}.block_count", 0)),
                         int(context) if context else None, header)
    from specdec.fp32.loading import read_manifest

    manifest = read_manifest(path)
    return ModelInfo(str(path), "safetensors", int(manifest.get("num_hidden_layers") or 0))


def check_same_vocabularies(target: ModelInfo, draft: ModelInfo) -> None:
    """VocabularyMismatchError, naming both paths, unless both models have the same vocabulary: GGUF files compared
    from their headers, directories from their tokenizers (no model loads)."""
    from specdec.fp32.loading import check_same_vocabulary

    if target.weights != draft.weights:
        raise ValueError(f"{target.path} and {draft.path}: both GGUF files (*{GGUF_SUFFIX}) or both model directories")
    if target.weights == "gguf":
        from specdec.gguf.loading import check_same_gguf_vocabulary

        return check_same_gguf_vocabulary(target.header, draft.header, target.path, draft.path)
    check_same_vocabulary(load_tokenizer(target.path), load_tokenizer(draft.path), target.path, draft.path)


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer text is encoded with: a GGUF file's own (gguf.loading.load_gguf_tokenizer), or a prepared
    directory's (local files only, no remote code)."""
    if weights_of(path) == "gguf":
        from specdec.gguf.loading import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)


def draft_runtime(spec: Mapping, runtime: Runtime) -> Runtime:
    """The runtime a draft model loads with: the study's, in the draft's own dtype where its spec names one. The
    draft's precision never touches exactness (the rule uses the q the draft actually computed), only its speed
    and acceptance."""
    return replace(runtime, dtype=spec.get("dtype") or runtime.dtype)


def load_target(path, runtime: Runtime, backend_tables: dict | None = None, max_length: int | None = None):
    """The target as a decoding job runs it, per runtime.weights: (a prepared model, its tokenizer) from a model
    directory, or (a LeanLM session, the file's vocabulary) from a GGUF file (max_length: its KV cache's positions;
    backend tables do not apply there; runtime.argmax_head builds its exact greedy head). With runtime.session
    "fixed" the model comes in its FixedShapeLM (a static cache of max_length positions, every pass
    runtime.session_rows rows: specdec/fixed_shape.py)."""
    if runtime.weights == "gguf":
        from specdec.gguf.loading import load_gguf_for_decoding

        return load_gguf_for_decoding(path, runtime, max_length=max_length, argmax_head=runtime.argmax_head)
    from specdec.fp32.loading import load_for_decoding

    model, tokenizer = load_for_decoding(path, runtime, backend_tables)
    if runtime.session == "fixed":
        from specdec.fixed_shape import session_for

        return session_for(model, runtime, max_length=max_length), tokenizer
    return model, tokenizer


def load_draft_model(name: str, spec: Mapping, draft_dir, target_tokenizer, runtime: Runtime,
                     backend_tables: dict | None = None, target=None):
    """A draft's model, loaded in its runtime; its vocabulary must equal the target's. runtime.weights
    'safetensors': the prepared model directory `draft_dir`; 'gguf': a session over the GGUF file `draft_dir` (its
    first layers for a truncated cut), sharing the target's weights where it is the target's file (target: the
    target's session; target_tokenizer: its vocabulary)."""
    kind = get_kind(spec["kind"], f"draft {name!r}: kind")
    if kind.load is not None:  # a model of its own kind (a feature head), made for this target, in either regime
        if not draft_dir:
            raise ValueError(f"draft {name!r} of kind {spec['kind']!r} needs its model directory")
        return kind.load(draft_dir, target)
    if runtime.weights == "gguf":
        from specdec.gguf.loading import load_gguf_draft

        return load_gguf_draft(name, spec, draft_dir, target, target_tokenizer, runtime)
    if not draft_dir:
        raise ValueError(f"draft {name!r} of kind {spec['kind']!r} needs a prepared model directory")
    from specdec.fp32.loading import check_same_vocabulary, load_for_decoding

    model, tokenizer = load_for_decoding(draft_dir, draft_runtime(spec, runtime), backend_tables)
    check_same_vocabulary(target_tokenizer, tokenizer, "target", name)
    return _first_layers(kind, name, spec, model, draft_dir)


def _first_layers(kind, name: str, spec: Mapping, model, draft_dir):
    """A cut kind's model (truncated: the first `layers` layers of its model) from a deeper directory: those layers,
    sharing its weights, as the gguf regime cuts a file (the command line's --draft DIR --draft-layers N). The
    study's truncate stage writes a directory of exactly `layers` layers, which is returned as it is."""
    if not kind.gguf_cut:
        return model
    layers, total = int(spec["layers"]), model.config.num_hidden_layers
    if layers == total:
        return model
    if not 1 <= layers <= total:
        raise DraftSpecError(f"draft {name!r}: layers {layers} is not within 1..{total}, the layers of {draft_dir}")
    from specdec.drafts import early_exit_model

    return early_exit_model(model, layers)


def make_draft(name: str, spec: Mapping, target, target_tokenizer, draft_dir, runtime: Runtime,
               backend_tables: dict | None = None):
    """The proposer a draft spec ({kind, ...fields}) asks for, built by its kind (specdec.drafts.registry). In the
    gguf regime `target` is a LeanLM session and `target_tokenizer` its file's vocabulary; a kind that cannot run
    there, or a draft dtype, is refused by name before any model loads. The spec's field values are not checked
    here (registry.check_spec: the study's config check and the command line do it first)."""
    kind = get_kind(spec["kind"], f"draft {name!r}: kind")
    target_layers = None

    def load():
        return load_draft_model(name, spec, draft_dir, target_tokenizer, runtime, backend_tables, target)

    if runtime.weights == "gguf":
        from specdec.drafts.registry import gguf_draft_source
        from specdec.gguf.loading import first_layers

        gguf_draft_source(name, spec)
        target_layers = lambda layers: first_layers(target, layers)  # noqa: E731
    elif runtime.session == "fixed":  # a draft's model, and the target's own first layers, in fixed-shape sessions too
        target_layers, load = _fixed_shape_drafts(target, runtime, load)
    resources = DraftResources(target=target, vocab_size=_vocab_size(target), eos_token_ids=_eos_ids(target),
                               draft_model=load if kind.model else None, target_layers=target_layers)
    return kind.build(spec, resources)


def _fixed_shape_drafts(target, runtime: Runtime, load):
    """With runtime.session "fixed": (n -> a session over the target's first n layers, a loader that puts a draft's
    Hugging Face model in a session of the target's rows and cache length), so a draft's passes are fixed-shape too
    (a model of its own kind, a feature head, comes back as it is)."""
    from transformers import PreTrainedModel

    from specdec.fixed_shape import FixedShapeLM, session_for, target_layer_sessions

    if not isinstance(target, FixedShapeLM):
        raise TypeError(f"runtime session 'fixed' drafts for a FixedShapeLM target (load_target's), got "
                        f"{type(target).__name__}")

    def load_in_session():
        model = load()
        return (session_for(model, runtime, max_length=target.max_length) if isinstance(model, PreTrainedModel)
                else model)

    return target_layer_sessions(target.model, runtime, max_length=target.max_length), load_in_session


def _vocab_size(target) -> int:
    from transformers import PreTrainedModel

    from specdec.lm import vocab_size_of

    return vocab_size_of(target) if isinstance(target, PreTrainedModel) else target.vocab_size  # a session's own


def _eos_ids(target) -> frozenset[int]:
    from transformers import PreTrainedModel

    from specdec.lm import eos_ids_of

    return eos_ids_of(target) if isinstance(target, PreTrainedModel) else frozenset(target.eos_token_ids)


__all__ = ["GGUF_SUFFIX", "ModelInfo", "check_model", "check_same_vocabularies", "draft_runtime", "load_draft_model",
           "load_target", "load_tokenizer", "make_draft", "weights_of"]
