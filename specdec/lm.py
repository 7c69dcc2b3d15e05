"""Language-model sessions: a model plus the state of one sequence (its KV cache), behind three verbs.

`extend(tokens, n_logits)` feeds tokens and returns the logits of the last n positions, `crop(length)` rolls the
state back to a prefix, `reset()` starts a new sequence. The decoding loops only speak these verbs, so the same
loop runs over a KV-cached Hugging Face model (`CachedLM`) or over a memo of full forwards keyed by prefix
(`PrefixMemoLM`, used to draw tens of thousands of samples cheaply in the distribution checks).
"""

from __future__ import annotations

import copy
from typing import Protocol, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from .features import KeepsFeatures
from specdec.fp32.kernels import linear_backends


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


class CachedLM(KeepsFeatures):
    """A Hugging Face causal LM with a KV cache that is rolled back by position."""

    def __init__(self, model: PreTrainedModel, eos_token_ids: Sequence[int] | None = None):
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = vocab_size_of(model)
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else eos_ids_of(model)
        self._cache = DynamicCache(config=model.config)
        self._kernels: dict[int, str] = {}

    @property
    def length(self) -> int:
        return self._cache.get_seq_length()

    def _record_features(self, module, args, output) -> None:
        rows = [output.last_hidden_state[0], *self._layer_outputs]
        self._layer_outputs = []
        self._features.append(torch.cat(rows, dim=1) if len(rows) > 1 else rows[0])

    def _record_layer(self, module, args, output) -> None:
        # a decoder layer returns its hidden states, or a tuple that starts with them (transformers 4.x)
        self._layer_outputs.append((output[0] if isinstance(output, tuple) else output)[0].clone())

    def _decoder_layers(self) -> int:
        return len(self.model.get_decoder().layers)

    def kernel_for(self, rows: int) -> str:
        """The linear backends a forward over `rows` positions runs on (recorded with each step)."""
        if rows not in self._kernels:
            self._kernels[rows] = linear_backends(self.model, rows)
        return self._kernels[rows]

    def reset(self) -> None:
        self._cache = DynamicCache(config=self.model.config)
        self._crop_features(0)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        if not tokens:
            raise ValueError("extend needs at least one token")
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        # logits_to_keep: the LM head (vocab x hidden) only runs on the positions we decide on.
        # the features: a hook on the decoder for this forward only (other sessions may share the model)
        hooks = []
        if self._features is not None:
            self._layer_outputs = []
            decoder = self.model.get_decoder()
            hooks = [decoder.layers[i].register_forward_hook(self._record_layer) for i in self.feature_layers]
            hooks.append(decoder.register_forward_hook(self._record_features))
        try:
            out = self.model(input_ids=input_ids, cache=self._cache, use_cache=True, logits_to_keep=n_logits)
        finally:
            for hook in hooks:
                hook.remove()
        return out.logits[0].float().cpu()

    def crop(self, length: int) -> None:
        excess = self.length - length
        if excess < 0:
            raise ValueError(f"cannot crop to {length}: the cache holds only {self.length} tokens")
        if excess:
            # transformers 5.x: a negative argument removes that many trailing positions.
            self._cache.crop(-excess)
        self._crop_features(length)


class PrefixMemoLM:
    """Logits looked up by token prefix; a miss runs the model once (KV-cached) and memoises every prefix it saw.

    Exact for any model whose output at a position depends only on the tokens before it, which is what a causal LM
    is. Lets a distribution check run the real speculative loop N times while the model runs only once per prefix.

    exact_depth (optional): prefixes more than this many tokens past the prompt are answered with the logits of
    their ancestor at that depth. Tokens 1 .. exact_depth + 1 generated after the prompt are then drawn from the
    model's own distributions; later ones are not, which is harmless to a check that only looks at those first
    tokens (each emitted position is decided before any later one) and keeps the number of model calls bounded when
    long draft blocks branch. prompt_length: the prompt's length; None takes the first sequence fed after a reset
    as the prompt, which is wrong for a user that defers its prompt pass (HybridDraft's model draft).
    """

    def __init__(self, model, eos_token_ids: Sequence[int] | None = None, *,
                 exact_depth: int | None = None, prompt_length: int | None = None):
        if exact_depth is not None and (not isinstance(exact_depth, int) or exact_depth < 0):
            raise ValueError(f"exact_depth must be a non-negative integer or None, got {exact_depth!r}")
        if prompt_length is not None and (not isinstance(prompt_length, int) or prompt_length < 1):
            raise ValueError(f"prompt_length must be a positive integer or None, got {prompt_length!r}")
        # a Hugging Face model runs in a KV-cached session of its own; a session (the GGUF engine's LeanLM) is used as
        # it is, and must be this memo's alone
        self._model = CachedLM(model, eos_token_ids) if isinstance(model, PreTrainedModel) else as_session(model)
        self.model = model
        self.device = getattr(self._model, "device", torch.device("cpu"))
        self.vocab_size = self._model.vocab_size
        self.eos_token_ids = (frozenset(eos_token_ids) if eos_token_ids is not None
                              else frozenset(self._model.eos_token_ids))
        self.exact_depth = exact_depth
        self.prompt_length = prompt_length
        self._root_length: int | None = prompt_length  # the prompt's length (else: of the first extend after a reset)
        self._tokens: list[int] = []
        self._fed: list[int] = []  # the tokens the inner KV cache holds
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        self._hidden: dict[tuple[int, ...], torch.Tensor] | None = None  # per prefix, with keep_hidden_states
        self._frozen = False
        self.model_calls = 0

    @property
    def length(self) -> int:
        return len(self._tokens)

    def reset(self) -> None:
        self._tokens = []
        self._root_length = self.prompt_length

    def restrict(self, columns: Sequence[int]) -> None:
        """From now on answer only the memoised prefixes, with only these logit columns (vocab_size shrinks).

        For a check that knows in advance every prefix it can visit and every token it can draw: the per-sample
        work then scales with len(columns) instead of the full vocabulary. A prefix outside the memo is an error.
        """
        index = torch.as_tensor(list(columns), dtype=torch.long)
        self._memo = {key: row[index].clone() for key, row in self._memo.items()}
        self.vocab_size = len(index)
        self._frozen = True

    def restricted(self, columns: Sequence[int], prefixes=None) -> PrefixMemoLM:
        """A new session that answers like restrict() (only memoised prefixes, only these logit columns) and holds
        only `prefixes` (every memoised one when None; each must be memoised), leaving this memo as it is."""
        keys = list(self._memo) if prefixes is None else [tuple(p) for p in prefixes]
        missing = [key for key in keys if key not in self._memo]
        if missing:
            raise KeyError(f"{len(missing)} prefixes are not memoised (e.g. one of length {len(missing[0])})")
        view = copy.copy(self)
        view._tokens, view._fed, view._root_length = [], [], self.prompt_length
        view._memo = {key: self._memo[key] for key in keys}
        view.restrict(columns)
        return view

    def keep_hidden_states(self, layers: Sequence[int] = ()) -> None:
        """Memoise each prefix's final hidden state too (CachedLM.keep_hidden_states; with those `layers`' outputs
        beside it), for hidden_states()."""
        if self._hidden is not None:
            self._model.keep_hidden_states(layers)  # the session's check: the same layers again, or a clear error
        else:
            if self._memo and self._frozen:
                raise RuntimeError("keep_hidden_states on a restricted memo that kept none")
            self._memo.clear()  # computed without their hidden states: computed again on demand
            self._hidden = {}
            self._model.reset()
            self._fed = []
            self._model.keep_hidden_states(layers)

    def hidden_states(self, start: int, end: int) -> torch.Tensor:
        """(end - start, hidden) final hidden states of positions start..end-1 of the current sequence."""
        if self._hidden is None:
            raise RuntimeError("hidden_states needs keep_hidden_states() first")
        if not 0 <= start <= end <= len(self._tokens):
            raise IndexError(f"hidden states of positions {start}..{end - 1} asked; {len(self._tokens)} are held")
        keys = [self._key(tuple(self._tokens[: i + 1])) for i in range(start, end)]
        for key in keys:
            self.next_token_logits(key)  # computes a prefix not seen yet
        if not keys:
            config = self._model.model.config  # a Hugging Face config, or a GGUF file's (LeanLM)
            width = getattr(config, "hidden_size", None) or config.hidden
            return torch.empty(0, width * (1 + len(self._model.feature_layers)))
        return torch.stack([self._hidden[key] for key in keys])

    def _key(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        if self.exact_depth is None or self._root_length is None:
            return prefix
        return prefix[: self._root_length + self.exact_depth]

    def _compute(self, prefix: tuple[int, ...]) -> None:
        """One cached forward that ends at prefix, starting from the longest prefix the KV cache already holds."""
        if self._frozen:
            raise KeyError(f"prefix of length {len(prefix)} (ending {prefix[-3:]}) is not memoised and this memo "
                           "was restricted to the prefixes computed before restrict()")
        common = 0
        for a, b in zip(self._fed, prefix[:-1]):  # feed at least one token
            if a != b:
                break
            common += 1
        self._model.crop(common)
        logits = self._model.extend(prefix[common:], len(prefix) - common)
        self._fed = list(prefix)
        self.model_calls += 1
        for i, row in enumerate(logits):
            self._memo.setdefault(prefix[: common + i + 1], row)
        if self._hidden is not None:
            for i, row in enumerate(self._model.hidden_states(common, len(prefix))):
                self._hidden.setdefault(prefix[: common + i + 1], row.clone())

    def next_token_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        key = self._key(tuple(prefix))
        if key not in self._memo:
            self._compute(key)
        return self._memo[key]

    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        if not tokens:
            raise ValueError("extend needs at least one token")
        self._tokens.extend(tokens)
        if self._root_length is None:
            self._root_length = len(self._tokens)
        n = len(self._tokens)
        keys = [self._key(tuple(self._tokens[:end])) for end in range(n - n_logits + 1, n + 1)]
        missing = [key for key in keys if key not in self._memo]
        if missing:
            self._compute(max(missing, key=len))  # the longest miss brings its shorter ones along
        return torch.stack([self.next_token_logits(key) for key in keys])

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
