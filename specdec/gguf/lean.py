"""The lean Qwen2 forward over a GGUF file's own quantized weights, and `LeanLM`, a session over it.

Why not Hugging Face's modules: with quantized weights a step reads a sixth of the fp32 bytes, so the fixed cost per
layer (Python calls, small ops, cache bookkeeping) becomes a large share of it. Here a layer is a short straight run
of calls on preallocated state: one native RMSNorm call (specdec/native/rowops.py: torch's takes five small ops), the
q|k|v products (one call per run of one weight type), rotary as two multiplies, a roll and an add on q and k
together, two writes into a static KV cache, one attention call, the output product, the MLP's gate|up as one
product, one native silu(gate) * up, down, and the two residual adds. A decoding step or a verify pass runs that
same sequence for every layer in one native call (specdec/gguf/fused_layers.py: the same kernels, the same bits); a
prompt pass runs it here, layer by layer. A one-token step runs the model's `layers`; a pass of 2 rows or more runs
its `verify_layers` where the kernel plan keeps a second copy of a class in the layout faster at several rows
(`GGUFModel.layers_for`), and a pass of 2 logits or more the model's second head where it has one
(`GGUFModel.head_for`): the same bits either way.

Batch invariance: every product runs on `QuantMatrix.matmul` (order-fixed per output, whatever the row count and
thread count, where the native kernel runs), passes of up to `attention.INVARIANT_ROWS` rows on the native
attention, and everything else is per-row work whose bits do not depend on the other rows (an RMSNorm per row,
elementwise multiplies and adds, a table lookup for rotary, silu lane by lane). So a position's logits are the
same bits in a one-token step and in a verify pass of any size. Longer passes (a prompt) run torch's SDPA; the
baseline and the speculative loop run the same prompt pass, so those rows are never compared with a step's.

Greedy steps may skip most of the head: with `use_argmax_head` built, the decoding loops at temperature 0 turn on
`set_argmax_only`, and a pass of one logit (of up to 16, a verify pass, where the head's rows come in whole groups
of 16) then reads the Q6_K head's top four bits and only the rows that can be its argmax
(specdec/gguf/argmax_head.py): the same argmax, the same tokens.
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import torch
import torch.nn.functional as F

from specdec.native import attention, rowops

from specdec.gguf import fused_layers, quant
from specdec.native.attention import INVARIANT_ROWS, causal_attention
from specdec.features import KeepsFeatures
from specdec.gguf.argmax_head import ArgmaxHead
from specdec.gguf.model import GGUFModel, read_gguf

DEFAULT_MAX_LENGTH = 4096


class ContextLengthError(ValueError):
    """A pass that would run past the session's preallocated KV cache."""


def rotary_tables(head_dim: int, theta: float, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of positions 0..length-1, (length, 1, head_dim): Hugging Face's Qwen2 rotary values
    (inv_freq, position x inv_freq in fp32, duplicated halves) with the sign of rotate_half folded into sin, so that
    rotary(x) = x * cos + roll(x, head_dim / 2) * sin gives the bits of x * cos + rotate_half(x) * sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    angles = torch.arange(length, dtype=torch.float)[:, None] * inv_freq
    half = angles.shape[1]
    emb = torch.cat([angles, angles], dim=-1)
    sin = emb.sin()
    sin[:, :half] = -sin[:, :half]
    return emb.cos().unsqueeze(1), sin.unsqueeze(1)


def product_kernel(model: GGUFModel | None = None) -> str:
    """The name recorded with each step for the products this engine runs on: the product kernel, and "-r16" where
    the model's matrices are in groups of 16 rows (without a model: where models load that way now); a measured
    kernel plan's label where the model loaded with one (kernel_plan.KernelPlan.label: "gguf-amx-r16+head-rows")."""
    if model is not None and model.plan is not None and model.plan.source != "default":
        return f"gguf-{model.plan.label()}"
    grouped = None if model is None else any(m.layout == "r16" for w in model.layers for m in (w.q, w.v, w.up, w.down))
    return f"gguf-{quant.kernel_label(grouped)}"


class LeanLM(KeepsFeatures):
    """A session (extend / crop / reset, like `lm.CachedLM`) over a GGUF model run by the lean forward.

    model: a `GGUFModel` (shared, never modified: sessions over one file share its weights) or a GGUF file's path.
    max_length: positions the static KV cache holds (fp32, (layers, kv_heads, max_length, head_dim) for keys and for
    values, allocated once); a pass past it is a ContextLengthError. layers: run only the first `layers` decoder
    layers, then the model's own final norm and head (a truncated or early-exit draft over the same weights).
    `last_hidden`: the hidden states of every position of the last `extend`, after the last layer and before the
    final norm (a reference, not a copy). fused: run passes of up to `attention.INVARIANT_ROWS` rows through
    `fused_layers.FusedLayers` (one native call for every layer; the same bits) where it is built; False runs the
    Python forward (lean._layer) for every pass."""

    def __init__(self, model: GGUFModel | str | os.PathLike, *, max_length: int | None = None,
                 layers: int | None = None, eos_token_ids: Sequence[int] | None = None, fused: bool = True):
        self.model = model if isinstance(model, GGUFModel) else read_gguf(model)
        c = self.config = self.model.config
        if max_length is None:
            max_length = min(DEFAULT_MAX_LENGTH, c.context_length or DEFAULT_MAX_LENGTH)
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
        if layers is not None and (not isinstance(layers, int) or not 1 <= layers <= c.layers):
            raise ValueError(f"layers must be an integer in 1..{c.layers} (the file's block_count), got {layers!r}")
        self.max_length = max_length
        self.layers = self.model.layers[:layers]
        self._verify_layers = self.model.layers_for(2)[:layers]  # passes of 2 rows or more (GGUFModel.layers_for)
        self.vocab_size = c.vocab_size
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else c.eos_token_ids
        self.keys = torch.zeros(len(self.layers), c.kv_heads, max_length, c.head_dim)
        self.values = torch.zeros_like(self.keys)
        # per layer, (1, kv_heads, max_length, head_dim) views: the attention's layout without a call per pass
        self._caches = [(keys.unsqueeze(0), values.unsqueeze(0)) for keys, values in zip(self.keys, self.values)]
        self._cos, self._sin = rotary_tables(c.head_dim, c.rope_theta, max_length)
        self._fused = self._fused_verify = None
        if fused and fused_layers.available():
            self._fused = fused_layers.FusedLayers(c, self.layers, self.keys, self.values, self._cos, self._sin)
            self._fused_verify = self._fused if self.model.verify_layers is None else fused_layers.FusedLayers(
                c, self._verify_layers, self.keys, self.values, self._cos, self._sin)
        self._length = 0
        self.last_hidden: torch.Tensor | None = None
        self.head_vocab: int | None = None  # limit_head_vocab
        self.head_type: str | None = None  # requantize_head
        self._head = self.model.output
        self._verify_head = self.model.head_for(2)  # passes of 2 logits or more (GGUFModel.head_for)
        self._argmax_head: ArgmaxHead | None = None  # use_argmax_head
        self.argmax_only = False  # set_argmax_only

    @property
    def length(self) -> int:
        return self._length

    def limit_head_vocab(self, vocab: int) -> None:
        """From now on this session's logits are those of the first `vocab` token ids (the LM head's first rows: a
        step reads only them) and -inf for every other id, so a draft over it proposes among those ids only, its q
        zero elsewhere. Exactness does not depend on it (the rule takes the q the draft sampled from; where the
        target wants another id the residual gives it); acceptance does. Ids are ranked by the tokenizer's merge
        order, which roughly follows frequency: the first ids are the commonest pieces."""
        self._refuse_with_argmax_head("limit_head_vocab")
        if isinstance(vocab, bool) or not isinstance(vocab, int) or not 2 <= vocab <= self.vocab_size:
            raise ValueError(f"a head vocabulary must be an integer in 2..{self.vocab_size}, got {vocab!r}")
        head, whole = self.model.output, self.model.output.rows_per_group
        self._head = self._verify_head = head.first_rows(min(-(-vocab // whole) * whole, head.out_features))
        self.head_vocab = vocab
        if self.head_type is not None:  # the rows now kept, in the type asked for
            self._head = self._verify_head = self._head.requantized(self.head_type)

    def requantize_head(self, qtype: str) -> None:
        """From now on this session's LM head rows (those `limit_head_vocab` keeps) are held in `qtype` (one of
        quant.REQUANTIZE_TYPES), requantised from the file's: a draft's step reads fewer bytes (the 0.5B file's Q8_0
        head in Q5_0: 35% fewer) for logits a second rounding away from the file's. Only for a draft: exactness
        holds whatever the draft proposes, acceptance may move. Takes seconds (the gguf package's quantiser)."""
        self._refuse_with_argmax_head("requantize_head")
        self._head = self._verify_head = self._head.requantized(qtype)  # a draft's head: one copy
        self.head_type = qtype

    def _refuse_with_argmax_head(self, what: str) -> None:
        if self._argmax_head is not None:
            raise ValueError(f"{what}: this session's exact argmax head runs over the file's whole head; a draft's "
                             "head options and the target's argmax head do not mix")

    def use_argmax_head(self) -> None:
        """Builds the exact greedy head (argmax_head.ArgmaxHead: the Q6_K head's top four bits, 70% of its bytes
        again in memory, seconds) for the passes `set_argmax_only` asks it for: of one logit, or of up to
        `ArgmaxHead.max_rows` (16 where its first pass runs in groups of 16 rows). Only over the file's whole Q6_K
        head (a target's), never with `limit_head_vocab` or `requantize_head`."""
        if self.head_vocab is not None or self.head_type is not None:
            raise ValueError("the exact argmax head runs over the file's whole head, not one limited or requantised")
        self._argmax_head = ArgmaxHead(self._head)

    @property
    def argmax_head(self) -> ArgmaxHead | None:
        """The exact greedy head `use_argmax_head` built (its byte count and candidate statistics), or None."""
        return self._argmax_head

    def set_argmax_only(self, on: bool) -> None:
        """While on (and the head built by `use_argmax_head`), a pass that asks for the logits of one position (of up
        to `ArgmaxHead.max_rows`) returns the argmax head's: each position's argmax is the full head's, the other
        logits -inf where they cannot win. The
        greedy decoding loops turn it on for their run (decode.py) and back off after; anything that reads more
        than the argmax (sampling, a distribution) runs with it off. A no-op without the head."""
        self.argmax_only = bool(on) and self._argmax_head is not None

    def step_bytes(self) -> int:
        """Bytes a one-token step reads (the layers this session runs, the final norm and the head's rows it runs)."""
        return self.model.step_bytes(len(self.layers)) - self.model.head_bytes() + self._head.nbytes

    def kernel_for(self, rows: int) -> str:
        """Recorded with each step (decode.StepRecord.kernel): the model's plan label (it names the kernels of
        verify passes and prompts where they differ from a step's)."""
        return product_kernel(self.model)

    def _decoder_layers(self) -> int:
        return len(self.layers)

    def reset(self) -> None:
        self._length = 0
        self.last_hidden = None
        self._crop_features(0)

    def crop(self, length: int) -> None:
        if not isinstance(length, int) or not 0 <= length <= self._length:
            raise ValueError(f"cannot crop to {length}: the cache holds {self._length} tokens")
        self._length = length  # positions past it are overwritten by the next extend
        self._crop_features(length)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], n_logits: int) -> torch.Tensor:
        return self._extend(tokens, n_logits, None)

    @torch.inference_mode()
    def timed_extend(self, tokens: Sequence[int], n_logits: int) -> tuple[torch.Tensor, dict]:
        """`extend`, and the wall seconds of its parts (the cost model's profiles): 'embedding', 'layers' (one value
        per layer: measured in C around each layer on the fused path), 'norm' and 'lm_head'."""
        times: dict = {}
        return self._extend(tokens, n_logits, times), times

    def _pass_kernel(self, rows: int) -> str | None:
        """The product kernel a pass of `rows` runs on: its model's plan's (KernelPlan.pass_kernel: a step's, a verify
        pass's, a prompt's, of more rows than INVARIANT_ROWS); None where the model loaded without a measured plan
        (the process's kernel, quant.kernel_name)."""
        plan = self.model.plan
        if plan is None or plan.source == "default":
            return None
        return plan.pass_kernel(rows, prompt=rows > INVARIANT_ROWS)

    def _extend(self, tokens: Sequence[int], n_logits: int, times: dict | None) -> torch.Tensor:
        tokens = list(tokens)
        with quant.session_kernel(self._pass_kernel(len(tokens))):
            return self._pass(tokens, n_logits, times)

    def _pass(self, tokens: list[int], n_logits: int, times: dict | None) -> torch.Tensor:
        rows = len(tokens)
        if not rows:
            raise ValueError("extend needs at least one token")
        if not isinstance(n_logits, int) or not 1 <= n_logits <= rows:
            raise ValueError(f"n_logits must be in 1..{rows} (the tokens fed), got {n_logits!r}")
        start, end = self._length, self._length + rows
        if end > self.max_length:
            raise ContextLengthError(f"{end} positions exceed this session's KV cache of max_length "
                                     f"{self.max_length}; make the session with a larger max_length")
        begin = time.perf_counter()
        hidden = self.model.embedding.dequantize_rows(tokens)
        marks = [time.perf_counter()]
        kept = self.feature_layers if self._features is not None else ()
        layer_outputs = []  # the outputs of the kept layers (keep_hidden_states' `layers`), copies
        if rows <= INVARIANT_ROWS and self._fused is not None:
            layer_seconds = torch.zeros(len(self.layers), dtype=torch.float64) if times is not None else None
            fused = self._fused if rows == 1 else self._fused_verify
            for run in _runs_between(kept, len(self.layers)):  # one native call per run of layers
                hidden = fused.forward(hidden, start, layer_seconds, run)
                if run.stop - 1 in kept:
                    layer_outputs.append(hidden.clone())
            layer_times = layer_seconds.tolist() if times is not None else []
        else:
            cos, sin = self._cos[start:end], self._sin[start:end]
            attend = _invariant_attention if rows <= INVARIANT_ROWS and attention.available() else _sdpa_attention
            layer_times = []
            layers = self.layers if rows == 1 else self._verify_layers
            for i, (weights, (keys, values)) in enumerate(zip(layers, self._caches)):
                hidden = _layer(weights, self.config, hidden, keys, values, start, end, cos, sin, attend)
                if i in kept:
                    layer_outputs.append(hidden.clone())
                marks.append(time.perf_counter())
                layer_times.append(marks[-1] - marks[-2])
        self._length = end
        self.last_hidden = hidden
        norm_begin = time.perf_counter()
        if self._features is None:
            last = rowops.rms_norm(hidden[rows - n_logits:], self.model.output_norm, self.config.rms_eps)
        else:  # every row normed (the features), the head on the last n_logits of them
            normed = rowops.rms_norm(hidden, self.model.output_norm, self.config.rms_eps)
            self._features.append(torch.cat([normed, *layer_outputs], dim=1) if layer_outputs else normed)
            last = normed[rows - n_logits:]
        head_begin = time.perf_counter()
        # the head multiplies n_logits rows, not the pass's: a verify pass's one logit runs a step's kernel
        with quant.session_kernel(self._pass_kernel(n_logits)):
            if self.argmax_only and n_logits <= self._argmax_head.max_rows:
                logits = self._argmax_head.logits(last)
            else:
                logits = (self._head if n_logits == 1 else self._verify_head).matmul(last)
        if self.head_vocab is not None:  # the other ids' logits: -inf (q zero there)
            logits = torch.cat([logits[:, :self.head_vocab],
                                logits.new_full((n_logits, self.vocab_size - self.head_vocab), float("-inf"))], dim=1)
        if times is not None:
            times.update(embedding=marks[0] - begin, layers=layer_times, norm=head_begin - norm_begin,
                         lm_head=time.perf_counter() - head_begin)
        return logits


def _runs_between(kept: Sequence[int], n_layers: int) -> list[range]:
    """Layers 0..n_layers-1 as consecutive runs, each ending at a kept layer or the last: [range(0, n_layers)] when
    none is kept."""
    ends = [i + 1 for i in kept if i + 1 < n_layers] + [n_layers]
    return [range(a, b) for a, b in zip([0, *ends[:-1]], ends)]


def _layer(w, c, hidden, keys, values, start, end, cos, sin, attend):
    """One decoder layer over the rows of positions start..end-1; writes their keys and values into the cache
    (keys, values: this layer's (1, kv_heads, max_length, head_dim))."""
    rows, q_heads = hidden.shape[0], c.heads
    x = rowops.rms_norm(hidden, w.attn_norm, c.rms_eps)
    if len(w.qkv) == 1:
        matrix, bias = w.qkv[0]
        qkv = matrix.matmul(x, bias)
    else:
        qkv = torch.cat([matrix.matmul(x, bias) for matrix, bias in w.qkv], dim=1)
    qk_width = (q_heads + c.kv_heads) * c.head_dim
    qk = qkv[:, :qk_width].view(rows, q_heads + c.kv_heads, c.head_dim)
    qk = qk * cos + qk.roll(c.head_dim // 2, -1) * sin  # q and k rotated together (rotary_tables says why roll)
    keys[0, :, start:end] = qk[:, q_heads:].transpose(0, 1)
    values[0, :, start:end] = qkv[:, qk_width:].view(rows, c.kv_heads, c.head_dim).transpose(0, 1)
    out = attend(qk[:, :q_heads].transpose(0, 1).unsqueeze(0), keys[:, :, :end], values[:, :, :end],
                 c.head_dim ** -0.5)
    hidden = hidden + w.o.matmul(out.view(rows, c.hidden))
    x = rowops.rms_norm(hidden, w.ffn_norm, c.rms_eps)
    if len(w.gate_up) == 1:
        gate_up = w.gate_up[0].matmul(x)
        gate, up = gate_up[:, :c.ffn], gate_up[:, c.ffn:]
    else:
        gate, up = (matrix.matmul(x) for matrix in w.gate_up)
    return hidden + w.down.matmul(rowops.silu_mul(gate, up))


def _invariant_attention(query, keys, values, scale):
    """(1, heads, m, d) queries at the last m of the keys -> (1, m, heads, d), contiguous."""
    return causal_attention(query, keys, values, scale, where="lean attention")


def _sdpa_attention(query, keys, values, scale):
    """torch's attention for a long pass (a prompt): the query rows sit at the last positions of the keys."""
    rows, length = query.shape[2], keys.shape[2]
    mask = None if rows == length else torch.ones(rows, length, dtype=torch.bool).tril(length - rows)
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, is_causal=mask is None, scale=scale,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous()
