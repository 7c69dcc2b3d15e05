"""The built-in draft kinds (see registry.py for what a kind declares). The proposers' modules (torch, transformers)
are imported when a draft is built, not here: the workflow reads the registry at every start-up."""

from __future__ import annotations

from typing import Mapping

from ..errors import DraftSpecError
from .registry import DraftCost, DraftKind, DraftResources, register

DTYPE = {"enum": ["float32", "bfloat16"],
         "description": "the draft's weights in this dtype (default: runtime.dtype); exactness does not depend on it"}
MIN_CONFIDENCE = {"type": "number", "minimum": 0,
                  "description": "adaptive drafting: stop a block when the draft's probability of its token is below"}
LAYERS = {"type": "integer", "minimum": 1, "description": "decoder layers kept"}
NGRAM = {"type": "integer", "minimum": 1}
MODEL = {"type": "string", "description": "a model under `models`"}
HEAD_VOCAB = {"type": "integer", "minimum": 2,
              "description": "draft among the first `vocab` token ids only (the gguf regime): a step reads only those "
                             "rows of the LM head, q is zero on the other ids; exact whatever the value"}
HEAD_TYPE = {"enum": ["q5_0", "q8_0"],
             "description": "the draft's LM head rows requantised to this ggml block type at load (the gguf regime): "
                            "the 0.5B file's Q8_0 head in q5_0 reads 35% fewer bytes; exact whatever the value"}
PROMPT_WINDOW = {"type": "integer", "minimum": 1,
                 "description": "the draft reads only the prompt's last this many tokens: a long prompt's pass costs "
                                "the draft that many; exact whatever the value (default: the whole prompt)"}
MODEL_FIELDS = {"model": MODEL, "dtype": DTYPE, "min_confidence": MIN_CONFIDENCE, "vocab": HEAD_VOCAB,
                "head_type": HEAD_TYPE, "prompt_window": PROMPT_WINDOW}
LOOKUP_FIELDS = {"ngram_max": NGRAM, "ngram_min": NGRAM}
HYBRID_FIELDS = {
    "model_k": {"type": "integer", "minimum": 1,
                "description": "the model's blocks stop at this many tokens; lookup's run to the loop's k "
                               "(default: k for both)"},
    "defer_prefill": {"type": "boolean",
                      "description": "the model's prompt pass waits for the first block lookup cannot draft "
                                     "(default true); false runs it in the prompt phase"}}


def _model_draft(spec: Mapping, resources: DraftResources):
    from .model import ModelDraft

    model = resources.draft_model()
    if spec.get("vocab") is not None:
        if not hasattr(model, "limit_head_vocab"):
            raise DraftSpecError(f"a draft's `vocab` limits a GGUF file's LM head (runtime.weights 'gguf'); this "
                                 f"draft's model is a {type(model).__name__}")
        model.limit_head_vocab(int(spec["vocab"]))
    if spec.get("head_type") is not None:
        if not hasattr(model, "requantize_head"):
            raise DraftSpecError(f"a draft's `head_type` requantises a GGUF file's LM head (runtime.weights 'gguf'); "
                                 f"this draft's model is a {type(model).__name__}")
        model.requantize_head(spec["head_type"].upper())
    return ModelDraft(model, min_confidence=spec.get("min_confidence"), prompt_window=spec.get("prompt_window"))


def _lookup(spec: Mapping, resources: DraftResources):
    from .lookup import PromptLookupDraft

    return PromptLookupDraft(resources.vocab_size, spec.get("ngram_max", 3), spec.get("ngram_min", 1),
                             eos_token_ids=sorted(resources.eos_token_ids))


def _early_exit(spec: Mapping, resources: DraftResources):
    from .early_exit import EarlyExitDraft
    from .model import ModelDraft

    if resources.target_layers is not None:  # the regime's own session over the target's first layers (gguf)
        return ModelDraft(resources.target_layers(int(spec["layers"])), min_confidence=spec.get("min_confidence"))
    return EarlyExitDraft(resources.target, int(spec["layers"]), min_confidence=spec.get("min_confidence"))


def _hybrid(spec: Mapping, resources: DraftResources):
    from .hybrid import HybridDraft

    return HybridDraft(_lookup(spec, resources), _model_draft(spec, resources),
                       **{field: spec[field] for field in HYBRID_FIELDS if field in spec})


def _feature_head(spec: Mapping, resources: DraftResources):
    from .feature_head import Q8_0, FeatureHeadDraft
    from .hybrid import HybridDraft

    import torch

    dtype = spec.get("dtype")
    dtype = dtype if dtype in (None, Q8_0) else getattr(torch, dtype)
    head = FeatureHeadDraft(resources.draft_model(), resources.target, eos_token_ids=sorted(resources.eos_token_ids),
                            dtype=dtype)
    return HybridDraft(_lookup(spec, resources), head) if spec.get("lookup") else head


def _load_feature_head(directory, target):
    from .feature_head import FeatureHead

    return FeatureHead.load(directory)


def _untrained_feature_head(spec: Mapping, target):
    from .feature_head import untrained_head

    vocab = spec.get("vocab")  # untrained: the first ids (training takes the most frequent tokens of its data)
    return untrained_head(target, None if vocab is None else range(min(vocab, int(target.config.vocab_size))))


def _own_head(spec: Mapping) -> bool:
    """Whether the draft's LM head is not the file's whole head (`vocab`, `head_type`)."""
    return spec.get("vocab") is not None or spec.get("head_type") is not None


# A head of its own is priced at its measured proposal time: the profiles run the file's whole heads.
def _named_model_cost(name: str, spec: Mapping) -> DraftCost:
    return DraftCost(model=spec["model"], dtype=spec.get("dtype"), measured=_own_head(spec))


def _own_model_cost(name: str, spec: Mapping) -> DraftCost:
    return DraftCost(model=name, dtype=spec.get("dtype"), measured=_own_head(spec))


def _plain_model(spec: Mapping) -> bool:
    return spec.get("min_confidence") is None and spec.get("prompt_window") is None and not _own_head(spec)


register(DraftKind(
    "model", _model_draft, MODEL_FIELDS, required=("model",), model="named", cost=_named_model_cost,
    assisted=_plain_model, description="a prepared model of its own (a model under `models`)"))
register(DraftKind(
    "truncated", _model_draft, {**MODEL_FIELDS, "layers": LAYERS}, required=("model", "layers"), model="own",
    made_by="truncate", cost=_own_model_cost, gguf_cut=True,
    description="the first `layers` decoder layers of `model` with its norm and head, untrained"))
register(DraftKind(
    "distilled", _model_draft, {**MODEL_FIELDS, "layers": LAYERS, "training": {"$ref": "#/$defs/training"}},
    required=("model", "layers"), model="own", made_by="distill", cost=_own_model_cost,
    description="the first `layers` layers of `model`, trained on the target's distributions (distill_draft)"))
register(DraftKind(
    "feature_head", _feature_head,
    {"vocab": {"type": "integer", "minimum": 2, "description": "drafting vocabulary: the most frequent tokens of "
                                                                 "the training data (default: every token)"},
     "training": {"type": "object", "description": "the head's training (docs/feature-head.md)"},
     "dtype": {"enum": ["float32", "bfloat16", "q8_0"],
               "description": "the head's weights and LM head rows while drafting (default: as trained, float32); "
                              "bfloat16 halves the bytes of a step, q8_0 (ggml's 8-bit blocks, on the quantized "
                              "product) nearly quarters them, in either regime"},
     "lookup": {"type": "boolean", "description": "prompt lookup where it finds a match, the head elsewhere (as the "
                                                  "hybrid kind)"},
     "head": {"type": "string", "description": "another feature_head draft whose trained head this one drafts with "
                                               "(default: a head of its own, trained from its `training`)"},
     **LOOKUP_FIELDS},
    model="own", made_by="train_feature_head", load=_load_feature_head, untrained=_untrained_feature_head,
    cost=lambda name, spec: DraftCost(dtype=spec.get("dtype"), measured=True, head_layer=True,
                                      head_vocab=spec.get("vocab")),
    shared_from="head",
    description="one decoder layer over the target's own features and its norm and head (EAGLE-style), trained "
                "here on the target's answers"))
register(DraftKind(
    "early_exit", _early_exit, {"layers": LAYERS, "min_confidence": MIN_CONFIDENCE}, required=("layers",),
    cost=lambda name, spec: DraftCost(target_layers=int(spec["layers"])),
    description="the target's own first `layers` layers and head, sharing its weights"))
register(DraftKind(
    "prompt_lookup", _lookup, LOOKUP_FIELDS,
    description="no model: what followed the latest earlier occurrence of the context's last n tokens"))
register(DraftKind(
    "hybrid", _hybrid, {**MODEL_FIELDS, **LOOKUP_FIELDS, **HYBRID_FIELDS}, required=("model",), model="named",
    cost=lambda name, spec: DraftCost(model=spec["model"], dtype=spec.get("dtype"), measured=True),
    description="prompt lookup where it finds a match, the `model` draft where it does not"))
