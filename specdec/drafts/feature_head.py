"""A feature-level draft head (EAGLE-style): one decoder layer that reads the target's own features.

The feature of a position is the target's final hidden state there, after its final norm: what its LM head reads.
The head's input at position t is [feature(t-1), embedding(token t)] (the target's embeddings), folded to the hidden
width by `fc`; one decoder layer (attention over the head's own KV cache, MLP) follows, then the target's final norm
gives the predicted feature of t, and the target's LM head rows of the drafting vocabulary give the logits of the
token after t. Drafting runs on: the predicted feature of t and the drafted token t+1 make the next input.

The head's KV cache holds only positions whose input was a true target feature; the positions fed with predicted
features while drafting are dropped at rollback and fed again with the target's (which its verify pass computed
anyway: `CachedLM.keep_hidden_states`), so every block starts from the target's own state.

The drafting vocabulary (`draft_vocab`, e.g. the most frequent tokens of the training data) keeps q at zero on every
other token: the exact rule needs nothing of q but that the drafted token was drawn from it.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..sampling import SamplingConfig, argmax, sample_from, warp_logits
from .base import Proposal

WEIGHTS_FILE, CONFIG_FILE = "feature_head.safetensors", "feature_head.json"


@dataclass(frozen=True)
class HeadConfig:
    """The head's shapes, taken from the target's (its one layer is shaped like one of the target's layers)."""

    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    vocab_size: int  # the target's: the width of q
    # decoder layers of the target whose outputs the head fuses into its input beside the final hidden state
    # (EAGLE-3's low, middle and high features); none: the final hidden state alone
    fused_layers: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "fused_layers", tuple(int(i) for i in self.fused_layers))

    @property
    def feature_width(self) -> int:
        """The width of a target feature row the head reads: the final hidden state and the fused layers' outputs."""
        return self.hidden_size * (1 + len(self.fused_layers))

    @classmethod
    def of_target(cls, config) -> HeadConfig:
        """From a Hugging Face (Qwen2/Llama-style) config, or a GGUF file's (specdec.gguf.model.GGUFConfig)."""
        if hasattr(config, "ffn"):  # a GGUF file's
            return cls(config.hidden, config.heads, config.kv_heads, config.head_dim, config.ffn,
                       float(config.rope_theta), float(config.rms_eps), int(config.vocab_size))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get(
            "rope_theta", 10000.0)
        return cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
                   config.intermediate_size, float(theta), float(config.rms_norm_eps), int(config.vocab_size))


Q8_0 = "q8_0"  # a drafting copy's weights as Q8_0 blocks (FeatureHeadDraft's dtype)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


@dataclass
class HeadCache:
    """Keys and values of the positions the head has seen, (kv_heads, n, head_dim) each; n = 0 before any."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def crop(self, length: int) -> None:
        if self.keys is not None and length < self.length:
            self.keys, self.values = self.keys[:, :length], self.values[:, :length]


@dataclass(frozen=True)
class BlockState:
    """Where a block's drafting stands: the head's cache, the predicted feature of its last position, the logits of
    the next draft token over the drafting vocabulary, and the position the next token takes."""

    cache: HeadCache
    predicted: torch.Tensor
    logits: torch.Tensor
    position: int


def _rotary(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    angles = positions.float()[:, None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class FeatureHead(nn.Module):
    """fc over [feature, embedding], one pre-norm decoder layer; returns its output before the target's final norm."""

    def __init__(self, config: HeadConfig, draft_vocab: Sequence[int] | None = None):
        super().__init__()
        c = self.config = config
        width, kv_width = c.heads * c.head_dim, c.kv_heads * c.head_dim
        if c.fused_layers:  # zero-initialised: a head widened from a trained one starts drafting as that one did
            self.layer_norms = nn.ModuleList(RMSNorm(c.hidden_size, c.rms_eps) for _ in c.fused_layers)
            self.fuse = nn.Linear(len(c.fused_layers) * c.hidden_size, c.hidden_size, bias=False)
            nn.init.zeros_(self.fuse.weight)
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.q_proj = nn.Linear(c.hidden_size, width, bias=True)
        self.k_proj = nn.Linear(c.hidden_size, kv_width, bias=True)
        self.v_proj = nn.Linear(c.hidden_size, kv_width, bias=True)
        self.o_proj = nn.Linear(width, c.hidden_size, bias=False)
        self.ffn_norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        vocab = torch.arange(c.vocab_size) if draft_vocab is None else torch.as_tensor(list(draft_vocab))
        if vocab.ndim != 1 or not len(vocab) or vocab.min() < 0 or vocab.max() >= c.vocab_size or \
                len(vocab.unique()) != len(vocab):
            raise ValueError(f"draft_vocab must be distinct token ids in 0..{c.vocab_size - 1}")
        self.register_buffer("draft_vocab", vocab.sort().values.long())
        self._inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float) / c.head_dim))

    def forward(self, features: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None) -> torch.Tensor:
        """features, embeddings: (batch, T, hidden) at positions (T,) (absolute; the rotary angle). With a cache
        (batch 1), the T positions follow its own and are appended to it; without one, attention is causal within
        the T positions. Returns (batch, T, hidden)."""
        hidden, q, k, v = self.attention_inputs(features, embeddings, positions)
        batch, rows = features.shape[:2]
        if cache is not None:
            if batch != 1:
                raise ValueError(f"a head cache holds one sequence; got a batch of {batch}")
            if cache.keys is not None:
                k, v = torch.cat([cache.keys[None], k], dim=2), torch.cat([cache.values[None], v], dim=2)
            cache.keys, cache.values = k[0], v[0]
        length = k.shape[2]
        # one query row sees every key; several: causal among themselves, after the cached ones
        mask = None if rows == 1 else torch.ones(rows, length, dtype=torch.bool).tril(length - rows)
        return self.after_attention(hidden, q, k, v, mask)

    def fold(self, features: torch.Tensor) -> torch.Tensor:
        """Feature rows (..., feature_width) of the target folded to (..., hidden): the final hidden state plus the
        fused layers' outputs, each RMS-normed, through `fuse`. Rows already `hidden` wide (the head's predicted
        features while drafting, or a head that fuses nothing) are returned as they are."""
        c = self.config
        if features.shape[-1] == c.hidden_size:
            return features
        if features.shape[-1] != c.feature_width:
            raise ValueError(f"feature rows of width {features.shape[-1]}: this head reads {c.hidden_size} (a "
                             f"prediction) or {c.feature_width} (the final hidden state and layers "
                             f"{list(c.fused_layers)})")
        parts = features.unflatten(-1, (1 + len(c.fused_layers), c.hidden_size)).unbind(-2)
        normed = torch.cat([norm(part) for norm, part in zip(self.layer_norms, parts[1:])], dim=-1)
        return parts[0] + self.fuse(normed)

    def attention_inputs(self, features: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor):
        """(hidden, q, k, v) of T new positions: the folded input (batch, T, hidden) and the rotated queries and keys
        and the values, (batch, heads or kv_heads, T, head_dim). Training unrolls drafting with its own masks.
        features: the target's (feature_width wide; `fold`) or the head's predicted ones (hidden wide)."""
        c = self.config
        features = self.fold(features)
        batch, rows, _ = features.shape
        hidden = self.fc(torch.cat([features, embeddings], dim=-1))
        x = self.attn_norm(hidden)
        cos, sin = _rotary(positions, self._inv_freq, x.dtype)
        q = _rotate(self.q_proj(x).view(batch, rows, c.heads, c.head_dim).transpose(1, 2), cos, sin)
        k = _rotate(self.k_proj(x).view(batch, rows, c.kv_heads, c.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(batch, rows, c.kv_heads, c.head_dim).transpose(1, 2)
        return hidden, q, k, v

    def after_attention(self, hidden: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        mask: torch.Tensor | None) -> torch.Tensor:
        """The layer's output (batch, T, hidden) from attention_inputs' tensors, keys and values over every position
        the T queries may see (mask: (T, keys) booleans, True where one may)."""
        c = self.config
        batch, rows = hidden.shape[:2]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        hidden = hidden + self.o_proj(out.transpose(1, 2).reshape(batch, rows, c.heads * c.head_dim))
        x = self.ffn_norm(hidden)
        return hidden + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def save(self, directory: str | Path, **record) -> None:
        """The weights (safetensors) and a JSON of the config, the drafting vocabulary and `record` (training)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {name: t.detach().contiguous() for name, t in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_FILE))
        meta = {"config": asdict(self.config), "dtype": str(self.fc.weight.dtype).removeprefix("torch."), **record}
        (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, directory: str | Path) -> FeatureHead:
        from safetensors.torch import load_file

        directory = Path(directory)
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"{directory} holds no feature head ({name} is missing): run its training "
                                        "stage (snakemake ... train_feature_heads)")
        meta = json.loads((directory / CONFIG_FILE).read_text())
        state = load_file(str(directory / WEIGHTS_FILE))
        head = cls(HeadConfig(**meta["config"]), state["draft_vocab"].tolist())
        head.load_state_dict(state)
        return head.to(getattr(torch, meta["dtype"])).eval()


class TargetParts:
    """What the head reuses of a Hugging Face target: its embeddings, final norm and LM head (shared, never trained)."""

    def __init__(self, model):
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "embed_tokens") or not hasattr(inner, "norm") or \
                model.get_output_embeddings() is None:
            raise TypeError(f"{type(model).__name__}: a feature head needs a decoder-only causal LM with "
                            "model.embed_tokens, model.norm and an LM head (Llama/Qwen2-style), or a LeanLM session")
        self.model = model
        self.embed = inner.embed_tokens
        self.norm = inner.norm
        self.lm_head = model.get_output_embeddings()
        if getattr(self.lm_head, "bias", None) is not None:
            raise TypeError(f"{type(model).__name__}: a feature head reuses the LM head's rows as a bias-free "
                            "product; this LM head has a bias")
        self.vocab_size, self.hidden_size = self.lm_head.weight.shape

    def head_rows(self, draft_vocab: torch.Tensor) -> torch.Tensor:
        """The LM head's rows of the drafting vocabulary, (len(draft_vocab), hidden), a copy."""
        return self.lm_head.weight[draft_vocab].detach().clone()

    def new_session(self):
        from ..lm import CachedLM

        return CachedLM(self.model)


class GGUFTargetParts:
    """The same parts of a target run from its GGUF file (a LeanLM session): embedding rows and the LM head's rows
    dequantised (exactly the file's values), the final norm on the batch-invariant row kernel."""

    def __init__(self, session):
        self.model = session.model
        c = self.model.config
        self.vocab_size, self.hidden_size, self._eps = c.vocab_size, c.hidden, c.rms_eps
        self._max_length = session.max_length

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embedding.dequantize_rows([int(t) for t in tokens.reshape(-1)])

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        from specdec.native import rowops

        return rowops.rms_norm(x.float().reshape(-1, self.hidden_size).contiguous(), self.model.output_norm,
                               self._eps).reshape(x.shape)

    def head_rows(self, draft_vocab: torch.Tensor) -> torch.Tensor:
        return self.model.output.dequantize_rows(draft_vocab.tolist())

    def new_session(self):
        from specdec.gguf.lean import LeanLM

        return LeanLM(self.model, max_length=self._max_length)


def target_parts(target) -> TargetParts | GGUFTargetParts:
    """The parts a head reuses, of a Hugging Face model (or a session over one) or of a LeanLM session."""
    from specdec.gguf.lean import LeanLM

    if isinstance(target, LeanLM):
        return GGUFTargetParts(target)
    inner = getattr(target, "model", None)
    if not hasattr(target, "get_output_embeddings") and hasattr(inner, "get_output_embeddings"):
        target = inner  # a session (CachedLM, PrefixMemoLM) over a Hugging Face model
    return TargetParts(target)


class FeatureHeadDraft:
    """The proposer: drafts from the target's feature at the last position it verified (see the module docstring).

    The decoding loop hands it the target session it runs (`attach_target`), which then keeps the features of every
    position it computes. Used on its own (no session attached: a test, a user's own loop), it runs the target over
    the context itself, in a session of its own. q is the warped softmax over the drafting vocabulary, zero
    elsewhere."""

    def __init__(self, head: FeatureHead, target_model, eos_token_ids: Sequence[int] | None = None, *,
                 dtype: torch.dtype | str | None = None):
        """target_model: the target as the decode job runs it: a Hugging Face model (or a session over one), or a
        LeanLM session (the gguf regime). dtype: the drafting copy's weights (default: the head's; bfloat16 halves
        the bytes a step reads; "q8_0" (`Q8_0`) quarters them, on the quantized product, activations in fp32).
        Where the engine's native kernels are built, the head's products and the LM head rows run on them (one-row
        products near the bandwidth floor) instead of torch's."""
        self.parts = target_parts(target_model)
        self.vocab_size = head.config.vocab_size
        if (self.parts.vocab_size, self.parts.hidden_size) != (self.vocab_size, head.config.hidden_size):
            raise ValueError(f"the head was made for a target of vocabulary {self.vocab_size} and width "
                             f"{head.config.hidden_size}; this target has {self.parts.vocab_size} and "
                             f"{self.parts.hidden_size}")
        self.eos_token_ids = frozenset(eos_token_ids or ())
        self._vocab = head.draft_vocab
        # the LM head's rows of the drafting vocabulary, copied once: a step reads only these
        if isinstance(dtype, str) and dtype != Q8_0:
            raise ValueError(f"a feature head drafts in a torch dtype or {Q8_0!r}, got {dtype!r}")
        weights = dtype or head.fc.weight.dtype
        self._dtype = torch.float32 if weights == Q8_0 else weights  # the activations'
        self.head, self._rows = _drafting_copy(head, self.parts.head_rows(self._vocab), weights)
        self._target = self._own = None
        self._cache = HeadCache()
        self._drafted_from = 0  # the last head position of the block fed with a target feature

    @property
    def step_bytes(self) -> int:
        """Bytes of the weights one draft step reads: the drafting copy's layer, fc and norms and its LM head rows
        (in their drafting dtype; Q8_0 layers by their blocks)."""
        return _weight_bytes(self.head) + _weight_bytes(self._rows)

    def attach_target(self, session) -> None:
        """The target session of the decoding loop (before its prompt pass): it keeps the features we read."""
        keep = getattr(session, "keep_hidden_states", None)
        if keep is None:
            raise TypeError(f"a feature head drafts from the target's features; {type(session).__name__} does not "
                            "expose them (keep_hidden_states)")
        keep(self.head.config.fused_layers)
        self._target = session

    def _run_own_target(self, verified: Sequence[int]) -> None:
        """Without the loop's session: our own, fed up to `verified` (what the loop's target would have seen)."""
        if self._own is None:
            self._own, self._own_tokens = self.parts.new_session(), []
            self._own.keep_hidden_states(self.head.config.fused_layers)
            self._target = self._own
        common = 0
        for a, b in zip(self._own_tokens, verified):
            if a != b:
                break
            common += 1
        common = min(common, len(verified) - 1)  # feed at least one token
        self._own.crop(common)
        self._own.extend(list(verified[common:]), 1)
        self._own_tokens = list(verified)

    def prefill(self, prompt: Sequence[int], *, lazy: bool = True) -> float:
        """Start a new sequence. Always lazy (ModelDraft's `lazy`): the prompt's features come with the first
        proposal, which feeds them in one catch-up call."""
        self._cache = HeadCache()
        self._drafted_from = 0
        return 0.0

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig, generator: torch.Generator
                ) -> Proposal:
        if self._target is None or self._target is self._own:
            self._run_own_target(context[:-1])
        # Head position t reads [feature(t-1), token t]: feed every t the cache lacks, up to the last context token,
        # with the target's features (it has verified context[:-1]).
        first, last = self._cache.length + 1, len(context) - 1
        proposal = Proposal(tokens=[], q=None, catchup_tokens=last - first + 1 if last > first else 0)
        features = self._target.hidden_states(first - 1, last).to(self._dtype)
        tokens = torch.tensor(context[first:last + 1])
        q_rows = []
        for i in range(k):
            start = time.perf_counter()
            predicted, logits = self._step(features, tokens, first, self._cache)
            if sampling.greedy:
                token = int(self._vocab[argmax(logits)])
            else:
                token, probs = self.draw(self.scatter(logits), sampling, generator)
                q_rows.append(probs)
            elapsed = time.perf_counter() - start
            if i == 0 and proposal.catchup_tokens:
                proposal.catchup_seconds += elapsed
            else:
                proposal.draft_seconds += elapsed
            proposal.tokens.append(token)
            if token in self.eos_token_ids or i == k - 1:
                break
            first += len(tokens)
            features = predicted[None]
            tokens = torch.tensor([token])
        if q_rows:
            proposal.q = torch.stack(q_rows)
        self._drafted_from = last  # positions past it were fed predicted features
        return proposal

    def _step(self, features: torch.Tensor, tokens: torch.Tensor, first: int, cache: HeadCache):
        """Feed head positions first.. ([features, tokens]) into `cache`: (the predicted feature of the last one, the
        logits of the token after it over the drafting vocabulary)."""
        positions = torch.arange(first, first + len(tokens))
        embeddings = self.parts.embed(tokens).to(features.dtype)
        hidden = self.head(features[None], embeddings[None], positions, cache)[0, -1]
        predicted = self.parts.norm(hidden).to(hidden.dtype)  # the predicted feature of the last position fed
        return predicted, self._rows(predicted[None])[0].float()

    def scatter(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the drafting vocabulary as scores over the whole vocabulary (-inf off the drafting one)."""
        full = torch.full((self.vocab_size,), float("-inf"), dtype=logits.dtype)
        full[self._vocab] = logits
        return full

    @staticmethod
    def draw(scores: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator):
        """Above temperature 0: (the drafted token, the warped distribution it was drawn from), from scores over a
        vocabulary (the whole one; the distribution check's reduced one: the same finite scores)."""
        probs = warp_logits(scores, sampling)
        return sample_from(probs, generator), probs

    @torch.inference_mode()
    def block_start(self, context: Sequence[int]) -> BlockState:
        """The head's state at the start of a block from `context` (the target has verified context[:-1]): a fresh
        cache caught up on the context with the features of the proposer's own target session, and the logits of the
        first draft token. What a proposal from that context computes (a fresh catch-up equals the loop's cache to
        ~1e-6: tests/test_feature_head.py); the distribution check memoises these states (its laws and samples)."""
        context, attached = list(context), self._target
        self._run_own_target(context[:-1])
        if attached is not None:
            self._target = attached  # a loop's session stays the one proposals read
        cache = HeadCache()
        features = self._own.hidden_states(0, len(context) - 1).to(self._dtype)
        predicted, logits = self._step(features, torch.tensor(context[1:]), 1, cache)
        return BlockState(cache, predicted, logits, len(context))

    @torch.inference_mode()
    def block_step(self, state: BlockState, token: int) -> BlockState:
        """The state after drafting `token` from `state` (which is left as it is: the cache grows by a new tensor)."""
        cache = HeadCache(state.cache.keys, state.cache.values)
        predicted, logits = self._step(state.predicted[None], torch.tensor([int(token)]), state.position, cache)
        return BlockState(cache, predicted, logits, state.position + 1)

    def rollback(self, valid_length: int) -> None:
        # keep only positions fed with the target's own features (t <= the last context position of the block)
        self._cache.crop(min(self._drafted_from, valid_length))


class Q8Linear(nn.Module):
    """A linear layer whose weight is Q8_0 blocks (`quant.quantize_q8_0`) on the engine's quantized product: a
    drafting copy's layer in the GGUF regime, where a bf16 head read as many bytes as a sixth of the 4-bit target.
    fp32 in and out."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, name: str):
        super().__init__()
        from specdec.gguf.quant import quantize_q8_0

        self.weight = quantize_q8_0(weight, name)
        self.bias = None if bias is None else bias.detach().float().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return self.weight.matmul(rows, self.bias).reshape(*x.shape[:-1], self.weight.out_features)


def _weight_bytes(module: nn.Module) -> int:
    """Bytes of a module's weights as drafting reads them: its parameters and its Q8Linear layers' blocks and biases."""
    q8 = [m for m in module.modules() if isinstance(m, Q8Linear)]
    return (sum(p.numel() * p.element_size() for p in module.parameters())
            + sum(m.weight.nbytes + (0 if m.bias is None else m.bias.numel() * m.bias.element_size()) for m in q8))


def _quantized_copy(head: FeatureHead, rows: torch.Tensor) -> tuple[FeatureHead, nn.Module]:
    """The head and its LM head rows with every linear layer's weight in Q8_0 (norms and biases fp32)."""
    from specdec.gguf import quant

    if not quant.available():
        raise RuntimeError("a feature head in q8_0 runs on specdec.native._quant (an x86 CPU with AVX2, FMA and F16C)")
    head = copy.deepcopy(head).float().eval().requires_grad_(False)
    for name, module in list(head.named_children()):
        if isinstance(module, nn.Linear):
            setattr(head, name, Q8Linear(module.weight, module.bias, f"head.{name}"))
    return head, Q8Linear(rows, None, "head.lm_rows")


def _drafting_copy(head: FeatureHead, rows: torch.Tensor, dtype: torch.dtype | str) -> tuple[FeatureHead, nn.Module]:
    """The head and its LM head rows as drafting runs them: in `dtype`, on the native kernels where built (fp32:
    the AVX2 product; bf16: the AVX2 kernel reading the bf16 weights; Q8_0, the string "q8_0": the quantized
    product). The head given is left as it is (training and saving use it)."""
    from specdec.fp32 import kernels

    if dtype == Q8_0:
        return _quantized_copy(head, rows)
    head = copy.deepcopy(head).to(dtype).eval()
    linear = nn.Linear(rows.shape[1], rows.shape[0], bias=False, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(rows.to(dtype))
    drafting = nn.ModuleDict({"head": head, "rows": linear}).requires_grad_(False)
    if kernels.invariant_kernels_available():
        if dtype == torch.bfloat16:
            kernels.use_row_adaptive_bf16_linear(drafting, default="avx2-bf16")
        elif dtype == torch.float32:
            kernels.use_backends(drafting, "avx2")
    return drafting["head"], drafting["rows"]


def untrained_head(target_model, draft_vocab: Sequence[int] | None = None, seed: int = 0,
                   fused_layers: Sequence[int] = ()) -> FeatureHead:
    """A freshly initialised head for a target (a Hugging Face model, in its dtype; or a LeanLM session, in fp32):
    what training starts from. fused_layers: target layers whose outputs it fuses beside the final hidden state."""
    torch.manual_seed(seed)
    config = HeadConfig.of_target(target_model.config)
    head = FeatureHead(replace(config, fused_layers=tuple(fused_layers)), draft_vocab)
    parameters = getattr(target_model, "parameters", None)
    return head.to(next(parameters()).dtype if parameters else torch.float32).eval()
