"""Loading GGUF files for decoding (`Runtime.weights == "gguf"`): each model runs from its file's own quantized
tensors on the lean forward (`lean.LeanLM` over `gguf_model.read_gguf`), never as fp32 weight matrices.

What a decoding job needs from a GGUF path: `load_gguf_for_decoding` gives a session over the model (more sessions
over the same weights in memory: `LeanLM(session.model, layers=n)`, as `first_layers` and `load_gguf_draft` make)
and the file's vocabulary; `load_gguf_tokenizer` gives its tokenizer where text must be encoded (the CLI, the
study's prompts). Before any of that, `check_gguf` reads the file's header alone (no tensor bytes, well under a
second for the study's files) and refuses, by name, a missing file, a file that is not GGUF, an architecture other
than qwen2, tensor types the quantized kernel does not run and a file without a vocabulary; so a pair is checked
whole before either model loads.

Drafts in this regime (`gguf_draft_source`): a kind whose model is a model of `models` runs that model's GGUF file;
a truncated cut runs the first n layers of its model's file (the same weights, no file of its own); kinds without a
model (prompt lookup, early exit over the target's own weights) need nothing. A kind whose weights are its own
(distilled: trained safetensors) and a draft `dtype` (the file's types are the weights' precision) are refused,
naming the draft.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

import torch

from specdec.drafts.registry import gguf_draft_source
from specdec.errors import DraftSpecError
from specdec.fp32.loading import check_same_vocabulary
from specdec.gguf.header import VOCABULARY_KEY, GGUFFileError, GGUFHeader, read_header
from specdec.gguf.lean import LeanLM
from specdec.gguf.model import ARCHITECTURE, GGUFModelError, read_gguf
from specdec.gguf.quant import SUPPORTED_TYPES, UnsupportedTensorType
from specdec.runtime import Runtime


def _listing(items: list[str]) -> str:
    return ", ".join(items[:12]) + (f" and {len(items) - 12} more" if len(items) > 12 else "")


def check_gguf(path: str | os.PathLike) -> GGUFHeader:
    """Refuse, from the header alone, a file the quantized engine cannot run: not GGUF, not qwen2, tensor types
    outside quant.SUPPORTED_TYPES (named), no vocabulary. `read_gguf` checks the rest (names, shapes, metadata)."""
    header = read_header(path)
    if header.architecture != ARCHITECTURE:
        raise GGUFModelError(f"{path}: architecture {header.architecture!r}; the lean engine runs {ARCHITECTURE} "
                             "models only")
    unsupported = [f"{name} ({t.qtype})" for name, t in header.tensors.items() if t.qtype not in SUPPORTED_TYPES]
    if unsupported:
        raise UnsupportedTensorType(f"{path}: {len(unsupported)} tensors of types the quantized engine does not run "
                                    f"({', '.join(SUPPORTED_TYPES)}): {_listing(unsupported)}")
    if not isinstance(header.metadata.get(VOCABULARY_KEY), list):
        raise GGUFFileError(f"{path} has no vocabulary ({VOCABULARY_KEY}): a draft's tokens could not be checked "
                            "against the target's, nor text encoded")
    return header


class GGUFVocabulary:
    """A GGUF file's token strings by id, with a tokenizer's get_vocab() and len(): what check_same_vocabulary
    compares, read from the header (a tokenizer's construction is not needed to compare two files)."""

    def __init__(self, header: GGUFHeader):
        self.path = header.path
        self.tokens: list[str] = header.metadata[VOCABULARY_KEY]

    def get_vocab(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)


def check_same_gguf_vocabulary(target: GGUFHeader | str | os.PathLike, draft: GGUFHeader | str | os.PathLike,
                               target_name: str = "target", draft_name: str = "draft") -> None:
    """Both files' vocabularies (from their headers, checked ones or read now, before either model loads):
    VocabularyMismatchError naming both where they differ."""
    target, draft = (h if isinstance(h, GGUFHeader) else check_gguf(h) for h in (target, draft))
    check_same_vocabulary(GGUFVocabulary(target), GGUFVocabulary(draft), target_name, draft_name)


# --- models, sessions, tokenizer --------------------------------------------------------------------------------------
def load_gguf_for_decoding(path: str | os.PathLike, runtime: Runtime, *, max_length: int | None = None,
                           layers: int | None = None, log: Callable[[str], None] = lambda _: None,
                           argmax_head: bool = False) -> tuple[LeanLM, GGUFVocabulary]:
    """A GGUF file as a decoding job runs it: a LeanLM session over the model as the file holds it (its `.model`
    is the weights, shared by any further session) and the file's vocabulary. Refusals (check_gguf, then read_gguf's
    own) come before any tensor is copied. max_length: positions the session's KV cache holds (default: LeanLM's).
    argmax_head: the session's exact greedy head is built (LeanLM.use_argmax_head; a target's, as
    specdec.load.load_target asks where runtime.argmax_head is set)."""
    if runtime.weights != "gguf":
        raise ValueError(f"load_gguf_for_decoding runs runtime weights 'gguf', got {runtime.weights!r}")
    if runtime.threads:
        torch.set_num_threads(runtime.threads)  # the quantized kernel runs torch's thread count
    header = check_gguf(path)
    model = read_gguf(path)
    log(f"read {path}: {model.config.layers} layers, {model.step_bytes() / 2**20:.0f} MiB per step")
    session = LeanLM(model, max_length=max_length, layers=layers)
    if argmax_head:
        if model.output.qtype != "Q6_K":
            raise ValueError(f"runtime argmax_head needs a Q6_K LM head; {path}'s is {model.output.qtype}")
        session.use_argmax_head()
        log(f"{path}: greedy steps read the head's top four bits ({session.argmax_head.nbytes / 2**20:.0f} MiB)")
    return session, GGUFVocabulary(header)


def first_layers(session: LeanLM, layers: int) -> LeanLM:
    """A session over the first `layers` layers of `session`'s model with its final norm and head: the same weights
    in memory, a KV cache of its own (an early exit over the target, a truncated cut of a draft's file)."""
    return LeanLM(session.model, max_length=session.max_length, layers=layers)


def load_gguf_tokenizer(path: str | os.PathLike):
    """The tokenizer a GGUF file describes (its vocabulary, merges, special tokens and chat template), through
    transformers. For qwen2 files Qwen2Tokenizer reads it directly: AutoTokenizer would first build the model's
    config from the file, several times slower on the study's files for the same tokenizer."""
    from transformers import AutoTokenizer, Qwen2Tokenizer

    header = check_gguf(path)
    path = Path(path)
    loader = Qwen2Tokenizer if header.architecture == "qwen2" else AutoTokenizer
    tokenizer = loader.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    context = header.metadata.get(f"{header.architecture}.context_length")
    if context:  # the file says how long a sequence the model takes; transformers leaves it unbounded
        tokenizer.model_max_length = int(context)
    return tokenizer


# --- drafts -----------------------------------------------------------------------------------------------------------
def load_gguf_draft(name: str, spec: Mapping, path: str | os.PathLike | None, target: LeanLM,
                    target_vocabulary: GGUFVocabulary, runtime: Runtime) -> LeanLM:
    """A draft's model in the gguf regime: a session over its GGUF file (its first n layers for a truncated cut),
    sharing the target's weights where it is the target's own file; its vocabulary must equal the target's."""
    source = gguf_draft_source(name, spec)
    if source is None:
        raise ValueError(f"draft {name!r} of kind {spec['kind']!r} loads no model")
    model_name, layers = source
    if not path:
        raise ValueError(f"draft {name!r} runs the GGUF file of model {model_name!r}: no path given")
    if target.model.path and Path(path).resolve() == Path(target.model.path).resolve():
        vocabulary, model = target_vocabulary, target.model  # the target's own file: its weights, read once
    else:
        vocabulary = GGUFVocabulary(check_gguf(path))
        check_same_vocabulary(target_vocabulary, vocabulary, "target", name)  # before the draft's bytes are read
        model = load_gguf_for_decoding(path, runtime, max_length=target.max_length)[0].model
    if layers is not None and not 1 <= layers <= model.config.layers:
        raise DraftSpecError(f"draft {name!r}: layers {layers} is not within 1..{model.config.layers}, the layers of "
                             f"{path}")
    return LeanLM(model, max_length=target.max_length, layers=layers)
