"""EarlyExitDraft: self-speculation. The target's own first n decoder layers + its final norm + its LM head, sharing
the target's weights (no copy), with a KV cache of its own."""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn
from transformers import PreTrainedModel

from ..lm import CachedLM
from .model import ModelDraft


def _decoder_parts(model: PreTrainedModel):
    inner = getattr(model, "model", None)
    parts = [getattr(inner, name, None) for name in ("embed_tokens", "layers", "norm")]
    if not isinstance(model, PreTrainedModel) or any(p is None for p in parts) or model.get_output_embeddings() \
            is None:
        raise TypeError(f"{type(model).__name__} is not a decoder-only causal LM with model.embed_tokens, "
                        "model.layers, model.norm and an LM head (Llama/Qwen2/Mistral-style)")
    return inner


def early_exit_model(target: PreTrainedModel, n_layers: int) -> PreTrainedModel:
    """A causal LM of the target's class whose modules ARE the target's: embed_tokens, the first n_layers decoder
    layers, rotary embedding, final norm and LM head (the same Parameter objects; nothing is copied).

    The config is a copy with num_hidden_layers / layer_types cut to n_layers, so the cache and masks are built for
    n layers. The layers keep their layer_idx 0..n-1 (they index the cache by it). Apply
    specdec.fp32.kernels.use_weight_major_linear to the target *before* building this, so that both share the fast path
    (done after, the layers still share it, the LM head not). Do not request output_hidden_states/attentions from
    both models: Hugging Face would hook the shared layers twice.
    """
    inner = _decoder_parts(target)
    total = target.config.num_hidden_layers
    if not isinstance(n_layers, int) or not 1 <= n_layers <= total:
        raise ValueError(f"n_layers must be an integer in 1..{total}, got {n_layers!r}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:n_layers]
    if getattr(config, "max_window_layers", None) is not None:
        config.max_window_layers = min(config.max_window_layers, n_layers)
    # Built on the meta device (no memory), then every module that holds tensors is replaced by the target's.
    with torch.device("meta"):
        shallow = type(target)(config)
    shallow.config._attn_implementation = target.config._attn_implementation
    shallow.model.embed_tokens = inner.embed_tokens
    shallow.model.layers = nn.ModuleList(list(inner.layers)[:n_layers])
    shallow.model.norm = inner.norm
    if hasattr(inner, "rotary_emb"):
        shallow.model.rotary_emb = inner.rotary_emb
    shallow.set_output_embeddings(target.get_output_embeddings())
    left = [name for name, t in [*shallow.named_parameters(), *shallow.named_buffers()] if t.is_meta]
    if left:
        raise TypeError(f"{type(target).__name__}: cannot share {left} with the target")
    shallow.generation_config = copy.deepcopy(target.generation_config)
    return shallow.train(target.training)


class EarlyExitDraft(ModelDraft):
    """Self-speculative draft: the target's first n_layers layers + final norm + LM head (shared weights), with
    its own KV cache. Otherwise a ModelDraft (min_confidence: adaptive drafting, see ModelDraft)."""

    def __init__(self, target_model, n_layers: int, eos_token_ids: Sequence[int] | None = None, *,
                 min_confidence: float | None = None):
        # A session (CachedLM, PrefixMemoLM) is accepted for its model.
        if not isinstance(target_model, PreTrainedModel) and isinstance(getattr(target_model, "model", None),
                                                                        PreTrainedModel):
            target_model = target_model.model
        self.n_layers = n_layers
        self.model = early_exit_model(target_model, n_layers)
        super().__init__(CachedLM(self.model, eos_token_ids), min_confidence=min_confidence)
