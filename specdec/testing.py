"""Tiny randomly initialised Qwen2-style models for tests and the tiny workflow config (fast, offline)."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    init_std: float = 0.5,
    dtype: torch.dtype = torch.float64,
    eos_token_id: int | None = None,
) -> Qwen2ForCausalLM:
    """A random Qwen2 causal LM. A large init_std gives peaked next-token distributions (a real model's are),
    so greedy paths are not decided by near-ties; float64 keeps one-token and multi-token passes equal to ~1e-15."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init_std,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = eos_token_id
    return model


def perturbed_copy(model: Qwen2ForCausalLM, noise: float, seed: int = 1) -> Qwen2ForCausalLM:
    """A draft that mostly agrees with `model`: the same weights plus relative Gaussian noise."""
    copy = Qwen2ForCausalLM(model.config).to(next(model.parameters()).dtype).eval()
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(noise * parameter.std() * torch.randn(parameter.shape, generator=generator,
                                                                  dtype=parameter.dtype))
    copy.generation_config.eos_token_id = model.generation_config.eos_token_id
    return copy
