"""Fixed-shape sessions: every pass of a Hugging Face model is R rows over a static KV cache, with a mask.

A kernel's reduction order depends on the shapes it is called with, not on the data. `FixedShapeLM` calls every
kernel with one shape only: a one-token step and a verify pass over m <= R positions are both padded to R rows
(`rows`), and attention always runs over the whole static cache (`max_length + rows - 1` key slots), the keys past a
row's own position masked off. A position's logits are then the same bits whichever pass computed them, with the
vendor's own kernels (no order-fixed native kernels needed), and the pass is what a CUDA graph needs: captured once,
replayed for every step and verify pass. On the CPU the same pass runs without graphs (tests/test_fixed_shape.py
proves the identity there, in fp32 and bf16).

Why padding cannot touch a real row: every operation but attention works row by row; in attention a real row at
position p attends to the key slots 0..p only, and padded rows sit at positions after every real one (they write
their keys and values into slots past the real ones, which the next pass overwrites, and which no real row reads).
Stale slots past the session's length (after a crop or reset) are masked the same way.

What the construction still assumes: that a kernel treats every row of its one shape alike. On the AMD EPYC Zen 4
(AVX-512) torch's fp32 product sums the trailing rows of a 5..7-row call (and of 9..11) in another order than the
others, so R = 5 breaks the identity there while R = 1..4, 8 and 12..24 keep it; the default R = 16 is the one the
tests prove (on a GPU: to be measured there, the same tests run on cuda).

The session speaks CachedLM's verbs (extend / crop / reset, logits of the last positions, KeepsFeatures' hidden
states), so it drops into decode.py's loops and into every draft kind that wraps a session. `session_for` builds the
session a `Runtime` asks for (runtime.session: "cached" or "fixed").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import torch
from transformers import PreTrainedModel

from specdec.features import KeepsFeatures
from specdec.fp32.kernels import linear_backends
from specdec.lm import CachedLM, eos_ids_of, vocab_size_of
from specdec.runtime import Runtime

GRAPHS = ("cuda_graph", "compile", "off")
# decoder layers whose forward is (hidden, mask, position ids, cache, rotary cos/sin) with full attention only
MODEL_TYPES = ("llama", "qwen2", "qwen3")
# attention functions that apply the mask they are given (specdec's invariant attention assumes the queries are the
# last positions of the keys, which a static cache's are not)
MASKED_ATTENTION = ("sdpa", "eager")
PAD_TOKEN = 0  # what padded rows feed: any valid id (their results are never read)
WARMUP_PASSES = 2  # eager passes on a side stream before a capture (lazy initialisations, cuBLAS workspaces)


def _decoder(model: PreTrainedModel):
    """The model's decoder (embed_tokens, layers, norm, rotary_emb), or a clear error for a model this cannot run."""
    inner = getattr(model, "model", None)
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not isinstance(model, PreTrainedModel) or inner is None or any(not hasattr(inner, p) for p in parts) \
            or model.get_output_embeddings() is None:
        raise TypeError(f"{type(model).__name__} is not a decoder-only causal LM with model.embed_tokens, "
                        "model.layers, model.norm, model.rotary_emb and an LM head (Llama/Qwen2-style)")
    config = model.config
    if config.model_type not in MODEL_TYPES:
        raise TypeError(f"a fixed-shape session runs model types {MODEL_TYPES}; this model is "
                        f"{config.model_type!r}")
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise TypeError(f"a fixed-shape session masks full causal attention only; this model's layers are "
                        f"{sorted(layer_types)}")
    rope_type = str(getattr(inner.rotary_emb, "rope_type", "default"))
    if "dynamic" in rope_type or rope_type == "longrope":
        raise TypeError(f"a fixed-shape session needs rotary frequencies that do not depend on the pass (its padded "
                        f"rows' positions would change them); this model's rope type is {rope_type!r}")
    if config._attn_implementation not in MASKED_ATTENTION:
        raise TypeError(f"a fixed-shape session needs an attention that applies its mask ({MASKED_ATTENTION}); this "
                        f"model runs {config._attn_implementation!r} (specdec's invariant attention takes no mask: "
                        "load the model with runtime linear_kernel other than 'invariant')")
    return inner


def _positive_int(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _graph_mode(graphs: str | None, device: torch.device) -> str:
    """The capture mode: None picks torch.cuda.graph on cuda and none elsewhere; a CUDA graph needs cuda."""
    if graphs is None:
        return "cuda_graph" if device.type == "cuda" else "off"
    if graphs not in GRAPHS:
        raise ValueError(f"graphs must be one of {GRAPHS} or None (cuda_graph on cuda, off elsewhere), got {graphs!r}")
    if graphs == "cuda_graph" and device.type != "cuda":
        raise ValueError(f"graphs 'cuda_graph' captures CUDA graphs; this model is on {device}")
    return graphs


class StaticKV:
    """Keys and values of every layer in fixed tensors (1, kv_heads, slots, head_dim). A pass writes its rows'
    keys and values at the slots `positions` holds (set before each pass; a static buffer under a graph) and attends
    over all slots. Speaks the one Cache method a Hugging Face attention layer calls (`update`)."""

    def __init__(self, config, slots: int, dtype: torch.dtype, device: torch.device, static_addresses: bool):
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        shape = (1, kv_heads, slots, head_dim)
        # zeros: slots never written are masked, but must be finite (0 x NaN would reach a real row)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.positions: torch.Tensor | None = None
        if static_addresses:  # torch.compile's cudagraphs: the cache is mutated in place at a fixed address
            for tensor in self.keys + self.values:
                torch._dynamo.mark_static_address(tensor)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if key_states.dtype != keys.dtype:
            raise TypeError(f"layer {layer_idx} computes keys in {key_states.dtype}; the static cache holds "
                            f"{keys.dtype} (the embedding's dtype)")
        keys.index_copy_(2, self.positions, key_states)
        values.index_copy_(2, self.positions, value_states)
        return keys, values


class FixedShapeLM(KeepsFeatures):
    """A Hugging Face causal LM whose every forward is `rows` rows over a static KV cache of `max_length` tokens.

    Same verbs as CachedLM: extend(tokens, n_logits) (a longer feed runs in chunks of `rows`), crop(length),
    reset(), keep_hidden_states / hidden_states. rows: R, the rows of every pass (a verify pass over up to R
    positions is one pass). max_length: the most tokens the session holds (prompt + generated + a drafted block).
    graphs: "cuda_graph" (torch.cuda.graph: one capture per kind of output, replayed), "compile" (torch.compile,
    mode "reduce-overhead"), "off", or None (cuda_graph on cuda, off elsewhere). Provenance: `describe()`."""

    kind = "fixed"

    def __init__(self, model: PreTrainedModel, max_length: int, rows: int = 16,
                 eos_token_ids: Sequence[int] | None = None, *, graphs: str | None = None):
        self._inner = _decoder(model)
        self.model = model
        self.rows = _positive_int(rows, "rows")
        self.max_length = _positive_int(max_length, "max_length")
        self.device = self._inner.embed_tokens.weight.device
        self.graphs = _graph_mode(graphs, self.device)
        self.vocab_size = vocab_size_of(model)
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else eos_ids_of(model)
        self._n_embeddings = self._inner.embed_tokens.weight.shape[0]
        self._dtype = self._inner.embed_tokens.weight.dtype
        self._slots = self.max_length + self.rows - 1  # the last real position's padded rows fit too
        with torch.inference_mode():
            self._kv = StaticKV(model.config, self._slots, self._dtype, self.device, self.graphs == "compile")
            self._key_slots = torch.arange(self._slots, device=self.device)
        self._length = 0
        self._runners: dict[tuple[int, ...] | None, Callable[[torch.Tensor], tuple]] = {}
        self.passes = 0  # fixed-shape passes run (a chunked prompt counts one per chunk)
        self.captures = 0  # graphs captured (or compilations started)
        self._kernel: str | None = None

    @property
    def length(self) -> int:
        return self._length

    def describe(self) -> dict:
        """What provenance records about this session."""
        return {"kind": self.kind, "rows": self.rows, "max_length": self.max_length, "graphs": self.graphs,
                "device": str(self.device), "dtype": str(self._dtype).removeprefix("torch.")}

    def kernel_for(self, rows: int) -> str:
        """What a pass runs on, as the steps record it: 'fixed<R>:' and the linear backends of R rows, whatever the
        pass's real rows (so a run's steps say which session ran them)."""
        if self._kernel is None:
            self._kernel = f"fixed{self.rows}:{linear_backends(self.model, self.rows)}"
        return self._kernel

    def _decoder_layers(self) -> int:
        return len(self._inner.layers)

    def reset(self) -> None:
        self._length = 0  # the old keys and values stay, masked, until overwritten
        self._crop_features(0)

    def crop(self, length: int) -> None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ValueError(f"crop needs a length >= 0, got {length!r}")
        if length > self._length:
            raise ValueError(f"cannot crop to {length}: the cache holds only {self._length} tokens")
        self._length = length
        self._crop_features(length)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        tokens = self._checked(tokens, n_logits)
        first_kept = len(tokens) - n_logits
        logits = []
        for start in range(0, len(tokens), self.rows):
            chunk = tokens[start:start + self.rows]
            chunk_logits = self._pass(chunk, keep_from=max(0, first_kept - start))
            if chunk_logits is not None:
                logits.append(chunk_logits)
        return torch.cat(logits)

    def _checked(self, tokens: Sequence[int], n_logits: int) -> list[int]:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("extend needs at least one token")
        if not isinstance(n_logits, int) or isinstance(n_logits, bool) or not 1 <= n_logits <= len(tokens):
            raise ValueError(f"n_logits must be an integer in 1..{len(tokens)} (the tokens fed), got {n_logits!r}")
        if self._length + len(tokens) > self.max_length:
            raise ValueError(f"feeding {len(tokens)} tokens after {self._length} exceeds the static cache's "
                             f"max_length {self.max_length}")
        if min(tokens) < 0 or max(tokens) >= self._n_embeddings:
            raise ValueError(f"token ids must lie in 0..{self._n_embeddings - 1}, got {min(tokens)}..{max(tokens)}")
        return tokens

    def _pass_rows(self, real_rows: int) -> int:
        """Rows the pass over `real_rows` tokens runs: always R (the point of this session)."""
        return self.rows

    def _pass(self, chunk: list[int], keep_from: int) -> torch.Tensor | None:
        """One pass over `chunk` (at most R tokens) padded to R rows: keeps its features, returns the float32 CPU
        logits of its rows keep_from.. (None when it keeps none)."""
        m, rows = len(chunk), self._pass_rows(len(chunk))
        inputs = torch.tensor([chunk + [PAD_TOKEN] * (rows - m), list(range(self._length, self._length + rows))])
        features_key = self.feature_layers if self._features is not None else None
        logits, features = self._runner(features_key, rows)(inputs)
        self._length += m
        self.passes += 1
        if features is not None:
            self._features.append(features[:m])
        return logits[keep_from:m].float().cpu() if keep_from < m else None

    def _forward(self, inputs: torch.Tensor, kept_layers: tuple[int, ...] | None):
        """The pass itself, on device tensors only (no host sync: capturable). inputs (2, rows): token ids, then
        positions. Returns the logits of every row and, when kept_layers is not None, the features of every row."""
        input_ids, positions = inputs[0:1], inputs[1]
        self._kv.positions = positions
        hidden = self._inner.embed_tokens(input_ids)
        # additive: 0 where a row may attend (key slots up to its own position), the dtype's lowest elsewhere
        allowed = self._key_slots[None, :] <= positions[:, None]
        mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
        mask = mask.masked_fill(~allowed, torch.finfo(hidden.dtype).min)[None, None]
        rotary = self._inner.rotary_emb(hidden, positions[None])
        outputs = []
        for i, layer in enumerate(self._inner.layers):
            hidden = layer(hidden, attention_mask=mask, position_ids=positions[None], cache=self._kv, use_cache=True,
                           position_embeddings=rotary)
            if kept_layers is not None and i in kept_layers:
                outputs.append(hidden[0])
        hidden = self._inner.norm(hidden)
        logits = self.model.get_output_embeddings()(hidden)[0]  # every row: the LM head's shape is fixed too
        features = None if kept_layers is None else torch.cat([hidden[0], *outputs], dim=1)
        return logits, features

    def _runner(self, features_key: tuple[int, ...] | None, rows: int) -> Callable[[torch.Tensor], tuple]:
        """The pass for this kind of output: eager, a captured CUDA graph, or a compiled function (made once)."""
        if self.graphs == "off" or rows != self.rows:
            return lambda inputs: self._forward(inputs.to(self.device), features_key)
        if features_key not in self._runners:
            make = _CapturedPass if self.graphs == "cuda_graph" else _CompiledPass
            self._runners[features_key] = make(self._forward, features_key, self.rows, self.device)
            self.captures += 1
        return self._runners[features_key]


class _CapturedPass:
    """The pass as a CUDA graph over static buffers: captured at its first call (after warm-up passes on a side
    stream, which write what that call writes: a pass is idempotent), replayed from then on."""

    def __init__(self, forward, features_key, rows: int, device: torch.device):
        self._forward, self._features_key = forward, features_key
        self._inputs = torch.zeros((2, rows), dtype=torch.long, device=device)
        self._graph = None
        self._outputs = None

    def __call__(self, inputs: torch.Tensor):
        self._inputs.copy_(inputs)
        if self._graph is None:
            self._capture()
        self._graph.replay()
        return self._outputs

    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_PASSES):
                self._forward(self._inputs, self._features_key)
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._outputs = self._forward(self._inputs, self._features_key)


class _CompiledPass:
    """The pass through torch.compile (mode "reduce-overhead": CUDA graphs of the compiled code on cuda, none on the
    CPU), over a static input buffer; its outputs are read before the next call overwrites them."""

    def __init__(self, forward, features_key, rows: int, device: torch.device):
        self._features_key = features_key
        self._inputs = torch.zeros((2, rows), dtype=torch.long, device=device)
        self._compiled = torch.compile(forward, mode="reduce-overhead", dynamic=False)

    def __call__(self, inputs: torch.Tensor):
        self._inputs.copy_(inputs)
        torch.compiler.cudagraph_mark_step_begin()
        return self._compiled(self._inputs, self._features_key)


def session_for(model: PreTrainedModel, runtime: Runtime, *, max_length: int | None = None,
                eos_token_ids: Sequence[int] | None = None, graphs: str | None = None) -> CachedLM | FixedShapeLM:
    """The session runtime.session names over a loaded Hugging Face model: a CachedLM ("cached"), or a
    FixedShapeLM of runtime.session_rows rows over a static cache of max_length tokens ("fixed"; max_length is
    then required: prompt + max_new_tokens + the largest k, at least). graphs: FixedShapeLM's (None: CUDA graphs
    on cuda, none elsewhere)."""
    if runtime.session == "cached":
        return CachedLM(model, eos_token_ids)
    if max_length is None:
        raise ValueError("runtime session 'fixed' runs a static KV cache: session_for needs its max_length (prompt "
                         "+ max_new_tokens + the largest k, at least)")
    return FixedShapeLM(model, max_length, runtime.session_rows, eos_token_ids, graphs=graphs)


def target_layer_sessions(model: PreTrainedModel, runtime: Runtime, *, max_length: int | None = None,
                          graphs: str | None = None) -> Callable[[int], CachedLM | FixedShapeLM]:
    """n -> a session (session_for's) over the model's own first n layers, norm and head, sharing its weights: what
    an early_exit draft runs (DraftResources.target_layers), in the same kind of session as the target."""
    from specdec.drafts.early_exit import early_exit_model

    return lambda n: session_for(early_exit_model(model, n), runtime, max_length=max_length, graphs=graphs)
