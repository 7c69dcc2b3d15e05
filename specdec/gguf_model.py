"""A GGUF file read into a Qwen2 model description: its configuration and its weights as the file holds them.

Every matrix stays in its file's block format (`quant.QuantMatrix`, a copy of the bytes in memory: no fp32 matrix is
ever made); norms and biases become fp32 vectors. A file the quantized engine cannot run is refused before any
bytes are copied, naming what is wrong: an architecture other than qwen2, a tensor type outside
`quant.SUPPORTED_TYPES`, a missing or unexpected tensor, a shape that disagrees with the metadata.

Layout: the products a layer runs on one input (q, k, v on the attention norm's output; gate and up on the MLP
norm's) are stored adjacent in one buffer where they share a type, so the forward runs them as one product call
(`LayerWeights.qkv`, `.gate_up`); the per-tensor matrices are views of that buffer.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .quant import BLOCKS, SUPPORTED_TYPES, QuantMatrix, UnsupportedTensorType

ARCHITECTURE = "qwen2"
VECTOR_TYPES = ("F32", "F16")  # norms and biases: read as fp32
LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
LAYER_VECTORS = ("attn_norm.weight", "ffn_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias")


class GGUFModelError(ValueError):
    """A GGUF file that is not a Qwen2 model the lean engine can run (wrong architecture, metadata or tensors)."""


@dataclass(frozen=True)
class GGUFConfig:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab_size: int
    eos_token_ids: frozenset[int]
    context_length: int | None = None


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    q: QuantMatrix
    k: QuantMatrix
    v: QuantMatrix
    q_bias: torch.Tensor
    k_bias: torch.Tensor
    v_bias: torch.Tensor
    o: QuantMatrix
    ffn_norm: torch.Tensor
    gate: QuantMatrix
    up: QuantMatrix
    down: QuantMatrix
    # q|k|v and gate|up as product calls: adjacent outputs of one type in one matrix, each with its bias slice
    qkv: tuple[tuple[QuantMatrix, torch.Tensor], ...] = ()
    gate_up: tuple[QuantMatrix, ...] = ()


@dataclass
class GGUFModel:
    config: GGUFConfig
    embedding: QuantMatrix  # token_embd: rows are looked up (dequantised), never multiplied
    layers: list[LayerWeights]
    output_norm: torch.Tensor
    output: QuantMatrix  # the LM head (the embedding itself where the file ties them: no output.weight)
    path: str = ""

    @property
    def tied(self) -> bool:
        return self.output is self.embedding

    def step_bytes(self, layers: int | None = None) -> int:
        """Bytes a one-token step reads (the bandwidth floor's numerator): every matrix but the embedding, whose one
        row is negligible, plus the norms and biases; over the first `layers` layers (all when None)."""
        matrices = [self.output] + [m for w in self.layers[:layers] for m in (w.q, w.k, w.v, w.o, w.gate, w.up, w.down)]
        vectors = [self.output_norm] + [v for w in self.layers[:layers]
                                        for v in (w.attn_norm, w.ffn_norm, w.q_bias, w.k_bias, w.v_bias)]
        return sum(m.nbytes for m in matrices) + sum(v.numel() * v.element_size() for v in vectors)


# --- metadata --------------------------------------------------------------------------------------------------------
class _Metadata:
    """A GGUF file's key-value metadata; a missing required key is an error naming the key and the file."""

    def __init__(self, reader, path):
        self.fields, self.path = reader.fields, path

    def get(self, key: str, default=None, *, required: bool = True):
        field = self.fields.get(key)
        if field is None:
            if required:
                raise GGUFModelError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return field.contents()


def _config(meta: _Metadata, vocab_size: int) -> GGUFConfig:
    a = ARCHITECTURE
    scaling = meta.get(f"{a}.rope.scaling.type", required=False)
    if scaling not in (None, "none"):
        raise GGUFModelError(f"{meta.path}: {a}.rope.scaling.type is {scaling!r}; the lean engine runs plain rotary "
                             "embeddings only")
    hidden, heads = int(meta.get(f"{a}.embedding_length")), int(meta.get(f"{a}.attention.head_count"))
    kv_heads = int(meta.get(f"{a}.attention.head_count_kv", heads, required=False))
    if hidden % heads or heads % kv_heads:
        raise GGUFModelError(f"{meta.path}: {a}.embedding_length {hidden} must split into {heads} heads, and "
                             f"{heads} heads into {kv_heads} key/value heads")
    head_dim = hidden // heads
    key_length = meta.get(f"{a}.attention.key_length", required=False)
    if key_length is not None and int(key_length) != head_dim:
        raise GGUFModelError(f"{meta.path}: {a}.attention.key_length {key_length} differs from embedding_length / "
                             f"head_count = {head_dim}")
    declared_vocab = meta.get(f"{a}.vocab_size", required=False)
    if declared_vocab is not None and int(declared_vocab) != vocab_size:
        raise GGUFModelError(f"{meta.path}: {a}.vocab_size {declared_vocab} differs from token_embd.weight's "
                             f"{vocab_size} rows")
    # the ids that end a turn: the end-of-sequence token, and an end-of-turn token where the file names one
    eos = [meta.get(f"tokenizer.ggml.{key}_token_id", required=False) for key in ("eos", "eot")]
    context = meta.get(f"{a}.context_length", required=False)
    return GGUFConfig(
        layers=int(meta.get(f"{a}.block_count")), hidden=hidden,
        ffn=int(meta.get(f"{a}.feed_forward_length")), heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        rope_theta=float(meta.get(f"{a}.rope.freq_base")),
        rms_eps=float(meta.get(f"{a}.attention.layer_norm_rms_epsilon")), vocab_size=vocab_size,
        eos_token_ids=frozenset(int(e) for e in eos if e is not None),
        context_length=None if context is None else int(context))


# --- checks before any work ------------------------------------------------------------------------------------------
def _expected_shapes(config: GGUFConfig, tied: bool) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward reads, as (out_features, in_features) or (n,)."""
    c = config
    kv = c.kv_heads * c.head_dim
    shapes = {"token_embd.weight": (c.vocab_size, c.hidden), "output_norm.weight": (c.hidden,)}
    if not tied:
        shapes["output.weight"] = (c.vocab_size, c.hidden)
    for i in range(c.layers):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (c.hidden,), f"blk.{i}.ffn_norm.weight": (c.hidden,),
            f"blk.{i}.attn_q.weight": (c.hidden, c.hidden), f"blk.{i}.attn_q.bias": (c.hidden,),
            f"blk.{i}.attn_k.weight": (kv, c.hidden), f"blk.{i}.attn_k.bias": (kv,),
            f"blk.{i}.attn_v.weight": (kv, c.hidden), f"blk.{i}.attn_v.bias": (kv,),
            f"blk.{i}.attn_output.weight": (c.hidden, c.hidden),
            f"blk.{i}.ffn_gate.weight": (c.ffn, c.hidden), f"blk.{i}.ffn_up.weight": (c.ffn, c.hidden),
            f"blk.{i}.ffn_down.weight": (c.hidden, c.ffn),
        })
    return shapes


def _listing(items) -> str:
    items = list(items)
    return ", ".join(items[:12]) + (f" and {len(items) - 12} more" if len(items) > 12 else "")


def _check_tensors(path, tensors: dict, config: GGUFConfig, tied: bool) -> None:
    unsupported = [f"{name} ({t.tensor_type.name})" for name, t in tensors.items()
                   if t.tensor_type.name not in SUPPORTED_TYPES]
    if unsupported:
        raise UnsupportedTensorType(f"{path}: {len(unsupported)} tensors of types the quantized engine does not run "
                                    f"({', '.join(SUPPORTED_TYPES)}): {_listing(unsupported)}")
    expected = _expected_shapes(config, tied)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise GGUFModelError(f"{path}: missing tensors: {_listing(missing)}")
    unexpected = [name for name in tensors if name not in expected]
    if unexpected:  # a weight the forward would leave out computes another model: refuse it rather than ignore it
        raise GGUFModelError(f"{path}: tensors the qwen2 forward does not use: {_listing(unexpected)}")
    wrong = []
    for name, shape in expected.items():
        t = tensors[name]
        got = tuple(int(s) for s in reversed(t.shape))  # ggml lists dimensions innermost first
        if got != shape:
            wrong.append(f"{name} is {got}, metadata says {shape}")
        elif len(shape) == 1 and t.tensor_type.name not in VECTOR_TYPES:
            wrong.append(f"{name} is {t.tensor_type.name}; norms and biases must be {' or '.join(VECTOR_TYPES)}")
        elif len(shape) == 2 and shape[1] % BLOCKS[t.tensor_type.name][0]:
            wrong.append(f"{name}: {shape[1]} values per row is not a whole number of {t.tensor_type.name} blocks")
    if wrong:
        raise GGUFModelError(f"{path}: tensors that disagree with the metadata: {'; '.join(wrong)}")


# --- copying the bytes -----------------------------------------------------------------------------------------------
def _raw_rows(t) -> np.ndarray:
    """A tensor's bytes as (rows, row_bytes) uint8 (a view of the file's memory map)."""
    data = np.asarray(t.data)
    rows = int(t.shape[1]) if len(t.shape) > 1 else 1
    return data.view(np.uint8).reshape(rows, -1)


def _vector(t) -> torch.Tensor:
    return torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(-1))


def _matrices(tensors: dict, names: list[str]) -> tuple[list[QuantMatrix], list[tuple[QuantMatrix, slice]]]:
    """The named matrices (one input width), in this order; returns a matrix per tensor and the product calls: each run
    of adjacent tensors of one type is copied into one buffer and multiplied as one matrix (the per-tensor matrices
    are views of it), with the range of the concatenated outputs it covers."""
    in_features = int(tensors[names[0]].shape[0])
    views, products, offset = [], [], 0
    for qtype, run in itertools.groupby(names, key=lambda name: tensors[name].tensor_type.name):
        run = list(run)
        raws = [_raw_rows(tensors[name]) for name in run]
        buffer = torch.empty(sum(raw.shape[0] for raw in raws), raws[0].shape[1], dtype=torch.uint8)
        row = 0
        for name, raw in zip(run, raws):
            part = buffer[row:row + raw.shape[0]]
            part.numpy()[:] = raw  # the copy out of the file's memory map
            views.append(QuantMatrix(part, qtype, in_features, name))
            row += raw.shape[0]
        joined = views[-1] if len(run) == 1 else QuantMatrix(buffer, qtype, in_features, "+".join(run))
        products.append((joined, slice(offset, offset + buffer.shape[0])))
        offset += buffer.shape[0]
    return views, products


def _layer(tensors: dict, i: int) -> LayerWeights:
    p = f"blk.{i}."
    (q, k, v), qkv = _matrices(tensors, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
    (gate, up), gate_up = _matrices(tensors, [p + "ffn_gate.weight", p + "ffn_up.weight"])
    bias = torch.cat([_vector(tensors[p + f"attn_{x}.bias"]) for x in "qkv"])
    q_end, k_end = q.out_features, q.out_features + k.out_features
    return LayerWeights(
        attn_norm=_vector(tensors[p + "attn_norm.weight"]), q=q, k=k, v=v, q_bias=bias[:q_end],
        k_bias=bias[q_end:k_end], v_bias=bias[k_end:], o=_matrices(tensors, [p + "attn_output.weight"])[0][0],
        ffn_norm=_vector(tensors[p + "ffn_norm.weight"]), gate=gate, up=up,
        down=_matrices(tensors, [p + "ffn_down.weight"])[0][0],
        qkv=tuple((matrix, bias[outputs]) for matrix, outputs in qkv),
        gate_up=tuple(matrix for matrix, _ in gate_up))


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Read a Qwen2 GGUF file: checks first (architecture, metadata, tensor types, names, shapes), then the bytes."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    reader = GGUFReader(path)
    meta = _Metadata(reader, path)
    architecture = meta.get("general.architecture")
    if architecture != ARCHITECTURE:
        raise GGUFModelError(f"{path}: architecture {architecture!r}; the lean engine runs {ARCHITECTURE} models only")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise GGUFModelError(f"{path}: missing tensors: token_embd.weight")
    config = _config(meta, vocab_size=int(tensors["token_embd.weight"].shape[1]))
    tied = "output.weight" not in tensors  # llama.cpp's convention for a model whose head is its embedding
    _check_tensors(path, tensors, config, tied)

    embedding = _matrices(tensors, ["token_embd.weight"])[0][0]
    return GGUFModel(
        config=config, embedding=embedding, layers=[_layer(tensors, i) for i in range(config.layers)],
        output_norm=_vector(tensors["output_norm.weight"]),
        output=embedding if tied else _matrices(tensors, ["output.weight"])[0][0], path=str(path))
