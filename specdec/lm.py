"""Language-model sessions: a model plus the state of one sequence (its KV cache), behind three verbs.

`extend(tokens, n_logits)` feeds tokens and returns the logits of the last n positions, `crop(length)` rolls the
state back to a prefix, `reset()` starts a new sequence. The decoding loops only speak these verbs, so the same
loop runs over a KV-cached Hugging Face model (`CachedLM`) or over a memo of full forwards keyed by prefix
(`PrefixMemoLM`, used to draw tens of thousands of samples cheaply in the distribution checks).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel


class LanguageModelSession(Protocol):
    vocab_size: int
    eos_token_ids: frozenset[int]

    @property
    def length(self) -> int:
        """Number of tokens whose keys/values the session holds."""

    def reset(self) -> None: ...

    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        """Feed tokens after the current state; return float32 CPU logits (n_logits, vocab) of the last positions."""

    def crop(self, length: int) -> None:
        """Forget everything after the first `length` tokens."""


def eos_ids_of(model: PreTrainedModel) -> frozenset[int]:
    """EOS ids from the generation config (Qwen chat models list several), else from the model config."""
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def vocab_size_of(model: PreTrainedModel) -> int:
    """Width of the logits (the LM head), which is what p and q share; not the tokenizer length."""
    return int(model.get_output_embeddings().weight.shape[0])


class CachedLM:
    """A Hugging Face causal LM with a KV cache that is rolled back by position."""

    def __init__(self, model: PreTrainedModel, eos_token_ids: Sequence[int] | None = None):
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = vocab_size_of(model)
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else eos_ids_of(model)
        self._cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        return self._cache.get_seq_length()

    def reset(self) -> None:
        self._cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        if not tokens:
            raise ValueError("extend needs at least one token")
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        # logits_to_keep: the LM head (vocab x hidden) only runs on the positions we decide on.
        out = self.model(input_ids=input_ids, cache=self._cache, use_cache=True, logits_to_keep=n_logits)
        return out.logits[0].float().cpu()

    def crop(self, length: int) -> None:
        excess = self.length - length
        if excess < 0:
            raise ValueError(f"cannot crop to {length}: the cache holds only {self.length} tokens")
        if excess:
            # transformers 5.x: a negative argument removes that many trailing positions.
            self._cache.crop(-excess)


class PrefixMemoLM:
    """Logits looked up by token prefix; a miss runs one full forward (no cache) and memoises every prefix of it.

    Exact for any model whose output at a position depends only on the tokens before it, which is what a causal LM
    is. Lets a distribution check run the real speculative loop N times while the model runs only once per prefix.
    """

    def __init__(self, model: PreTrainedModel, eos_token_ids: Sequence[int] | None = None):
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = vocab_size_of(model)
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else eos_ids_of(model)
        self._tokens: list[int] = []
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        self.model_calls = 0

    @property
    def length(self) -> int:
        return len(self._tokens)

    def reset(self) -> None:
        self._tokens = []

    @torch.inference_mode()
    def next_token_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self._memo:
            input_ids = torch.tensor([list(prefix)], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=input_ids, use_cache=False).logits[0].float().cpu()
            self.model_calls += 1
            for end in range(1, len(prefix) + 1):
                self._memo.setdefault(prefix[:end], logits[end - 1])
        return self._memo[prefix]

    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        if not tokens:
            raise ValueError("extend needs at least one token")
        self._tokens.extend(tokens)
        n = len(self._tokens)
        return torch.stack([self.next_token_logits(tuple(self._tokens[:end])) for end in range(n - n_logits + 1, n + 1)])

    def crop(self, length: int) -> None:
        if length > len(self._tokens):
            raise ValueError(f"cannot crop to {length}: the session holds only {len(self._tokens)} tokens")
        del self._tokens[length:]


def as_session(model_or_session) -> LanguageModelSession:
    """Accept a Hugging Face model (wrapped in a KV-cached session) or anything already speaking the session verbs."""
    if isinstance(model_or_session, PreTrainedModel):
        return CachedLM(model_or_session)
    for verb in ("extend", "crop", "reset"):
        if not hasattr(model_or_session, verb):
            raise TypeError(f"{type(model_or_session).__name__} is neither a PreTrainedModel nor a session (no {verb})")
    return model_or_session
