"""Where the time of one batch-1 forward goes: per-component wall times with a fixed-length KV cache.

`profile_model` times the embedding, every decoder layer, the final norm, the LM head and the whole forward of a
Hugging Face Qwen2-style causal LM (`model.model.embed_tokens`, `model.model.layers[i]`, `model.model.norm`,
`model.lm_head`) for m new positions on top of a cache of `context_length` tokens, as a verify pass over m = k + 1
positions (or a one-token step, m = 1) runs them; `profile_models` does it for several models interleaved, as the
fit across them needs. `memory_bandwidth` measures the machine's read bandwidth. The
tables feed `specdec.costmodel.fit_cost_model`.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import pandas as pd
import torch

from specdec.study.cost.model import ModelShape
from specdec.study.decoding.interleave import run_in_rotation

PROFILE_COLUMNS = ["model", "component", "layer", "m", "repeat", "seconds", "param_bytes", "n_layers", "hidden_size",
                   "intermediate_size", "vocab_size", "dtype_bytes", "kv_dim", "context_length"]
# A GGUF model's profile adds the head's bytes per weight (its type differs from the layers'; dtype_bytes is then the
# layers' mean bytes per weight).
LEAN_PROFILE_COLUMNS = [*PROFILE_COLUMNS, "head_dtype_bytes"]


def random_weights_model(architecture: dict, dtype: str, device: str | torch.device, seed: int = 0):
    """A Hugging Face causal LM of `architecture`'s config fields (its model_type and shapes, as
    config/random-weights.yaml gives them) with random weights, in `dtype` on `device`, for a profile where the real
    weights are not on the machine: a forward costs the same whatever its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(architecture)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).to(device).eval()


def param_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's parameters (what a forward through it has to read)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _components(model) -> list[tuple[str, int | None, torch.nn.Module]]:
    inner = model.model
    return ([("embedding", None, inner.embed_tokens)]
            + [("layer", i, layer) for i, layer in enumerate(inner.layers)]
            + [("norm", None, inner.norm), ("lm_head", None, model.lm_head)])


class _HookTimer:
    """Forward pre/post hooks that record each component's wall time of the current forward."""

    def __init__(self, components, sync):
        self.sync, self.seconds, self._start, self._handles = sync, {}, {}, []
        for name, layer, module in components:
            key = (name, layer)
            self._handles.append(module.register_forward_pre_hook(lambda *_, key=key: self._enter(key)))
            self._handles.append(module.register_forward_hook(lambda *_, key=key: self._leave(key)))

    def _enter(self, key):
        self.sync()
        self._start[key] = time.perf_counter()

    def _leave(self, key):
        self.sync()
        self.seconds[key] = time.perf_counter() - self._start[key]

    def remove(self):
        for handle in self._handles:
            handle.remove()


def sync_for(device: torch.device):
    """What waits for a device's queued work (nothing on the CPU): on a GPU kernels run asynchronously, so a timing
    synchronises before it reads the clock, that a component's time is its own."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _model_shape(model) -> dict:
    config, weight = model.config, next(model.parameters())
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"n_layers": len(model.model.layers), "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size, "vocab_size": int(model.lm_head.weight.shape[0]),
            "dtype_bytes": weight.element_size(), "kv_dim": config.num_key_value_heads * head_dim}


class _ProfileSession:
    """One model made ready to be timed: its cache filled to `context_length` tokens, hooks on its components; each
    `time_repeat` times one forward per m and leaves the cache as it found it."""

    def __init__(self, model, context_length: int, positions: Sequence[int], seed: int):
        self.model, self.context_length, self.positions = model, context_length, list(positions)
        device = next(model.parameters()).device
        self.sync = sync_for(device)
        self.shape = _model_shape(model)
        components = _components(model)
        self.sizes = {(c, layer): param_bytes(module) for c, layer, module in components}
        self.sizes[("forward", None)] = param_bytes(model)
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, self.shape["vocab_size"], (1, context_length + max(positions)), generator=generator)
        self.tokens = tokens.to(device)
        from transformers import DynamicCache  # here: the bandwidth stage imports this module without it

        self.cache = DynamicCache(config=model.config)
        model(input_ids=self.tokens[:, :context_length], cache=self.cache, use_cache=True, logits_to_keep=1)
        self.timer = _HookTimer(components, self.sync)
        self.rows: list[dict] = []

    def _timed(self, m: int) -> dict:
        ids = self.tokens[:, self.context_length:self.context_length + m]
        self.timer.seconds = {}
        self.sync()
        start = time.perf_counter()
        self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=m)
        self.sync()
        whole = time.perf_counter() - start
        self.cache.crop(-m)  # back to context_length, so every measurement sees the same cache
        return {**self.timer.seconds, ("forward", None): whole}

    def warm_up(self):
        for m in self.positions:
            self._timed(m)

    def time_repeat(self, repeat: int):
        # Interleave m and rotate its order per repeat: drifts of a shared machine spread over every m.
        for m, timings in run_in_rotation(self.positions, repeat, self._timed).items():
            for (component, layer), seconds in timings.items():
                self.rows.append({"component": component, "layer": layer, "m": m, "repeat": repeat,
                                  "seconds": seconds, "param_bytes": self.sizes[(component, layer)]})

    def close(self):
        self.timer.remove()

    def table(self, name: str) -> pd.DataFrame:
        table = pd.DataFrame(self.rows).assign(**self.shape, context_length=self.context_length, model=name)
        table["layer"] = table["layer"].astype("Int64")
        columns = LEAN_PROFILE_COLUMNS if "head_dtype_bytes" in table else PROFILE_COLUMNS
        return table[columns].sort_values(["m", "repeat"], kind="stable").reset_index(drop=True)


class _LeanProfileSession(_ProfileSession):
    """The same for a lean session over a GGUF file (specdec.gguf.lean.LeanLM, the gguf regime): its cache filled to
    `context_length` tokens; each layer's time is measured inside the fused native call (or around each layer of
    the Python forward), the embedding, final norm and head around their calls (LeanLM.timed_extend). Bytes are the
    file's own: each layer's tensors in their types; dtype_bytes is the layers' mean bytes per weight and
    head_dtype_bytes the head's."""

    def __init__(self, session, context_length: int, positions: Sequence[int], seed: int):
        self.model, self.context_length, self.positions = session, context_length, list(positions)
        model, c = session.model, session.config
        layers = len(session.layers)
        layer_bytes = [model.layer_bytes(i) for i in range(layers)]
        self.shape = {"n_layers": layers, "hidden_size": c.hidden, "intermediate_size": c.ffn,
                      "vocab_size": c.vocab_size, "kv_dim": c.kv_heads * c.head_dim}
        shape = ModelShape(layers, c.hidden, c.ffn, c.vocab_size, 1, self.shape["kv_dim"])
        self.shape["dtype_bytes"] = statistics.mean(layer_bytes) / shape.layer_params
        self.shape["head_dtype_bytes"] = model.head_bytes() / shape.head_bytes
        self.sizes = {("embedding", None): model.embedding.nbytes,
                      ("norm", None): model.output_norm.numel() * model.output_norm.element_size(),
                      ("lm_head", None): model.head_bytes(), ("forward", None): session.step_bytes(),
                      **{("layer", i): size for i, size in enumerate(layer_bytes)}}
        if session.max_length < context_length + max(positions):
            raise ValueError(f"the session's cache holds {session.max_length} positions: profiling needs "
                             f"{context_length + max(positions)} (context_length + the largest m)")
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, c.vocab_size, (context_length + max(positions),), generator=generator).tolist()
        session.reset()
        session.extend(self.tokens[:context_length], 1)
        self.rows = []

    def _timed(self, m: int) -> dict:
        start = time.perf_counter()
        _, parts = self.model.timed_extend(self.tokens[self.context_length:self.context_length + m], m)
        whole = time.perf_counter() - start
        self.model.crop(self.context_length)
        return {("embedding", None): parts["embedding"], ("norm", None): parts["norm"],
                ("lm_head", None): parts["lm_head"], ("forward", None): whole,
                **{("layer", i): seconds for i, seconds in enumerate(parts["layers"])}}

    def close(self):
        pass


class _HeadProfileSession(_ProfileSession):
    """A feature head's draft step (specdec.drafts.feature_head.FeatureHeadDraft, in its drafting dtype and kernels):
    its own KV cache filled to `context_length` positions, then one position more per timed step, as drafting feeds
    its predicted feature and the drafted token: m = 1 only (a head drafts one token a step; its catch-up over the
    verified positions is the decode jobs' to measure). The shape is the step's: one target-shaped layer, the
    drafting vocabulary's LM head rows; bytes: what a step reads (FeatureHeadDraft.step_bytes)."""

    def __init__(self, draft, context_length: int, positions: Sequence[int], seed: int):
        from specdec.drafts.feature_head import HeadCache

        c = draft.head.config
        self.model, self.context_length, self.positions = draft, context_length, [1]
        vocab, step_bytes = len(draft.head.draft_vocab), draft.step_bytes
        # weights per step as the fit counts a head's (prediction.head_shape: its fc as 2 hidden / 3 more MLP rows)
        weights = ModelShape(1, c.hidden_size, c.intermediate_size + 2 * c.hidden_size // 3, vocab, 1,
                             c.kv_heads * c.head_dim).step_bytes
        self.shape = {"n_layers": 1, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
                      "vocab_size": vocab, "kv_dim": c.kv_heads * c.head_dim, "dtype_bytes": step_bytes / weights}
        self.sizes = {("forward", None): step_bytes}
        generator = torch.Generator().manual_seed(seed)
        self.features = torch.randn(context_length + 1, c.hidden_size, generator=generator).to(draft._dtype)
        self.tokens = draft.head.draft_vocab[torch.randint(0, vocab, (context_length + 1,), generator=generator)]
        self.cache = HeadCache()
        draft._step(self.features[:context_length], self.tokens[:context_length], 1, self.cache)
        self.rows = []

    def _timed(self, m: int) -> dict:
        end = self.context_length + m
        start = time.perf_counter()
        self.model._step(self.features[self.context_length:end], self.tokens[self.context_length:end],
                         self.context_length + 1, self.cache)
        whole = time.perf_counter() - start
        self.cache.crop(self.context_length)
        return {("forward", None): whole}

    def close(self):
        pass


def _session_for(model, context_length: int, positions: Sequence[int], seed: int) -> _ProfileSession:
    # imported lazily: the bandwidth stage needs none of it
    from specdec.drafts.feature_head import FeatureHeadDraft

    if isinstance(model, FeatureHeadDraft):
        return _HeadProfileSession(model, context_length, positions, seed)
    lean = hasattr(model, "timed_extend")  # a LeanLM
    return (_LeanProfileSession if lean else _ProfileSession)(model, context_length, positions, seed)


@torch.inference_mode()
def profile_models(models: dict, context_length: int = 128, positions: Sequence[int] = tuple(range(1, 10)),
                   repeats: int = 5, warmup: int = 1, seed: int = 0) -> dict[str, pd.DataFrame]:
    """`profile_model` for several models at once ({name: model} -> {name: table}), interleaved: every repeat times
    each model in turn (the order rotated per repeat), so a drift of the shared machine lands on all of them alike
    instead of on whichever model happened to run during it. The cost-model fit compares layers of different widths
    across models; profiled one after the other, the same layer shape measured up to 17% apart on one machine."""
    if context_length < 1 or repeats < 1 or warmup < 0 or not positions or min(positions) < 1:
        raise ValueError("need context_length >= 1, repeats >= 1, warmup >= 0 and positions >= 1")
    if not models:
        raise ValueError("no model to profile")
    sessions: dict[str, _ProfileSession] = {}
    try:
        for name, model in models.items():
            sessions[name] = _session_for(model, context_length, positions, seed)
        names = list(sessions)
        for _ in range(warmup):
            for name in names:
                sessions[name].warm_up()
        for repeat in range(repeats):
            run_in_rotation(names, repeat, lambda name, repeat=repeat: sessions[name].time_repeat(repeat))
    finally:
        for session in sessions.values():
            session.close()
    return {name: session.table(name) for name, session in sessions.items()}


def profile_model(model, context_length: int = 128, positions: Sequence[int] = tuple(range(1, 10)),
                  repeats: int = 5, warmup: int = 1, name: str | None = None, seed: int = 0) -> pd.DataFrame:
    """Per-component wall times of batch-1 forwards of m new positions over a KV cache of `context_length` tokens.

    One row per component x m x repeat; components: 'embedding', 'layer' (with its index), 'norm', 'lm_head' and
    'forward' (the whole call, including what no hook sees: rotary embedding, mask, Python glue). The LM head runs
    on the m positions only (`logits_to_keep=m`), as in a verify pass. `name` labels the model in the 'model' column.
    """
    name = name or _default_name(_model_shape(model))
    return profile_models({name: model}, context_length=context_length, positions=positions, repeats=repeats,
                          warmup=warmup, seed=seed)[name]


def _default_name(shape: dict) -> str:
    return (f"L{shape['n_layers']}-h{shape['hidden_size']}-i{shape['intermediate_size']}"
            f"-v{shape['vocab_size']}-b{shape['dtype_bytes']}")


def memory_bandwidth(bytes_: int = 512 * 2**20, repeats: int = 5, device: str = "cpu") -> float:
    """Read bandwidth in bytes/s: median time of a torch sum over a float32 tensor of `bytes_` bytes.

    The tensor should be much larger than the last-level cache, or the number is the cache's bandwidth."""
    x = torch.ones(max(bytes_ // 4, 1), dtype=torch.float32, device=device)
    sync = sync_for(x.device)
    x.sum()  # first touch: page faults and kernel choice are not bandwidth
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        x.sum()
        sync()
        times.append(time.perf_counter() - start)
    return x.numel() * 4 / statistics.median(times)
