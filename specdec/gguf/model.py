"""A GGUF file read into a Qwen2 model description: its configuration and its weights as the file holds them.

Every matrix stays in its file's block format (`quant.QuantMatrix`, a copy of the bytes in memory: no fp32 matrix is
ever made); norms and biases become fp32 vectors. A file the quantized engine cannot run is refused before any
bytes are copied, naming what is wrong: an architecture other than qwen2, a tensor type outside
`quant.SUPPORTED_TYPES`, a missing or unexpected tensor, a shape that disagrees with the metadata, tensor data cut
short (a truncated file).

Reading: the header alone (`gguf_header.read_header`: metadata and tensor table; the vocabulary's strings are only
counted, never built), then each tensor's bytes copied out of a memory map of the file at the offset the table gives.

Layout: the products a layer runs on one input (q, k, v on the attention norm's output; gate and up on the MLP
norm's) are stored adjacent in one buffer where they share a type, so the forward runs them as one product call
(`LayerWeights.qkv`, `.gate_up`); the per-tensor matrices are views of that buffer.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from specdec.gguf import quant
from specdec.gguf.header import GGUFFileError, TensorInfo, read_header
from specdec.gguf.kernel_plan import HEAD, KernelPlan, plan_for
from specdec.gguf.quant import BLOCKS, SUPPORTED_TYPES, QuantMatrix, UnsupportedTensorType

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
    plan: KernelPlan | None = None  # the kernel and layouts it loaded with (specdec/gguf/kernel_plan.py)
    # the layers that passes of 2 rows or more run, where the plan lays a class out otherwise for them (its product
    # calls in that layout, the rest shared with `layers`); None: every pass runs `layers`
    verify_layers: list[LayerWeights] | None = None
    # the LM head that passes of 2 logits or more run, where the plan lays the head out otherwise for them (a copy of
    # `output`); None: every pass runs `output`
    verify_output: QuantMatrix | None = None

    def layers_for(self, rows: int) -> list[LayerWeights]:
        """The layers a pass of `rows` rows runs: the same bits whichever copy (every layout gives them)."""
        return self.layers if rows == 1 or self.verify_layers is None else self.verify_layers

    def head_for(self, logits: int) -> QuantMatrix:
        """The LM head a pass asking for `logits` rows of logits runs: the same bits whichever copy."""
        return self.output if logits == 1 or self.verify_output is None else self.verify_output

    @property
    def tied(self) -> bool:
        return self.output is self.embedding

    def step_bytes(self, layers: int | None = None) -> int:
        """Bytes a one-token step reads (the bandwidth floor's numerator): every matrix but the embedding, whose one
        row is negligible, plus the norms and biases; over the first `layers` layers (all when None)."""
        return (self.head_bytes() + self.output_norm.numel() * self.output_norm.element_size()
                + sum(self.layer_bytes(i) for i in range(len(self.layers[:layers]))))

    def layer_bytes(self, index: int) -> int:
        """Bytes of decoder layer `index`: its matrices in their file's types, its norms and biases."""
        w = self.layers[index]
        return (sum(m.nbytes for m in (w.q, w.k, w.v, w.o, w.gate, w.up, w.down))
                + sum(v.numel() * v.element_size() for v in (w.attn_norm, w.ffn_norm, w.q_bias, w.k_bias, w.v_bias)))

    def head_bytes(self) -> int:
        """Bytes of the LM head's matrix (the embedding's, where the file ties them)."""
        return self.output.nbytes


# --- metadata --------------------------------------------------------------------------------------------------------
class _Metadata:
    """A GGUF file's key-value metadata; a missing required key is an error naming the key and the file."""

    def __init__(self, metadata: Mapping[str, Any], path):
        self.metadata, self.path = metadata, path  # read_header's: values as the gguf package's field.contents()

    def get(self, key: str, default=None, *, required: bool = True):
        if key not in self.metadata:
            if required:
                raise GGUFModelError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return self.metadata[key]


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


def _check_tensors(path, tensors: dict[str, TensorInfo], config: GGUFConfig, tied: bool) -> None:
    unsupported = [f"{name} ({t.qtype})" for name, t in tensors.items() if t.qtype not in SUPPORTED_TYPES]
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
        if t.shape != shape:  # the header's shapes are in torch order (outermost first)
            wrong.append(f"{name} is {t.shape}, metadata says {shape}")
        elif len(shape) == 1 and t.qtype not in VECTOR_TYPES:
            wrong.append(f"{name} is {t.qtype}; norms and biases must be {' or '.join(VECTOR_TYPES)}")
        elif len(shape) == 2 and shape[1] % BLOCKS[t.qtype][0]:
            wrong.append(f"{name}: {shape[1]} values per row is not a whole number of {t.qtype} blocks")
    if wrong:
        raise GGUFModelError(f"{path}: tensors that disagree with the metadata: {'; '.join(wrong)}")


def _check_extents(path, tensors: dict[str, TensorInfo], file_size: int) -> None:
    """Every tensor's bytes inside the file: a truncated file is refused naming the tensors it cuts, before any copy
    (a memory map read past the file's end would fail in the middle, or read short)."""
    cut = [f"{name} (bytes {t.offset}..{t.end})" for name, t in tensors.items() if t.end > file_size]
    if cut:
        raise GGUFFileError(f"{path} is truncated ({file_size} bytes): the data of {len(cut)} tensors runs past its "
                            f"end: {_listing(cut)}")


# --- copying the bytes -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Tensor:
    """A checked tensor: its type, its shape (torch order) and its bytes (a uint8 view of the file's memory map)."""

    qtype: str
    shape: tuple[int, ...]
    data: np.ndarray


def _raw_rows(t: _Tensor) -> np.ndarray:
    """A tensor's bytes as (rows, row_bytes) uint8 (a view of the file's memory map)."""
    rows = t.shape[0] if len(t.shape) > 1 else 1
    return t.data.reshape(rows, -1)


def _vector(t: _Tensor) -> torch.Tensor:
    """An F32 or F16 vector as fp32 (a copy: nothing returned refers to the memory map)."""
    return torch.from_numpy(np.array(t.data.view(np.float32 if t.qtype == "F32" else np.float16),
                                     dtype=np.float32).reshape(-1))


def _matrices(tensors: dict, names: list[str], multiplied: bool = True, plan: KernelPlan | None = None,
              role: str = "layers") -> tuple[list[QuantMatrix], list[tuple[QuantMatrix, slice]]]:
    """The named matrices (one input width), in this order; returns a matrix per tensor and the product calls: each run
    of adjacent tensors of one type is copied into one buffer and multiplied as one matrix (the per-tensor matrices
    are views of it), with the range of the concatenated outputs it covers. Matrices that are multiplied get the
    layout the plan measured fastest for their class (the head, or the layers' matrices of their type), else
    `quant.preferred_layout`'s (groups of 16 rows on AVX-512), where every tensor of the run is whole groups, so that
    each tensor's rows stay a view of the buffer."""
    in_features = tensors[names[0]].shape[-1]
    views, products, offset = [], [], 0
    for qtype, run in itertools.groupby(names, key=lambda name: tensors[name].qtype):
        run = list(run)
        raws = [_raw_rows(tensors[name]) for name in run]
        buffer = quant.weight_bytes(sum(raw.shape[0] for raw in raws), raws[0].shape[1])
        row = 0
        for raw in raws:
            buffer[row:row + raw.shape[0]].numpy()[:] = raw  # the copy out of the file's memory map
            row += raw.shape[0]
        joined = QuantMatrix(buffer, qtype, in_features, "+".join(run))
        cls = HEAD if role == HEAD else qtype
        layout = ("rows" if not multiplied else plan.layout(cls, qtype, buffer.shape[0]) if plan
                  else quant.preferred_layout(qtype, buffer.shape[0]))
        if layout != "rows" and all(raw.shape[0] % quant.R16_ROWS == 0 for raw in raws):
            joined = joined.in_layout(layout)
        row = 0
        for name, raw in zip(run, raws):
            views.append(QuantMatrix(joined.raw[row:row + raw.shape[0]], qtype, in_features, name, joined.layout))
            row += raw.shape[0]
        if len(run) == 1:
            joined = views[-1]
        products.append((joined, slice(offset, offset + buffer.shape[0])))
        offset += buffer.shape[0]
    return views, products


LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _layer(tensors: dict, i: int, plan: KernelPlan | None = None) -> LayerWeights:
    p = f"blk.{i}."
    (q, k, v), qkv = _matrices(tensors, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], plan=plan)
    (gate, up), gate_up = _matrices(tensors, [p + "ffn_gate.weight", p + "ffn_up.weight"], plan=plan)
    bias = torch.cat([_vector(tensors[p + f"attn_{x}.bias"]) for x in "qkv"])
    q_end, k_end = q.out_features, q.out_features + k.out_features
    return LayerWeights(
        attn_norm=_vector(tensors[p + "attn_norm.weight"]), q=q, k=k, v=v, q_bias=bias[:q_end],
        k_bias=bias[q_end:k_end], v_bias=bias[k_end:],
        o=_matrices(tensors, [p + "attn_output.weight"], plan=plan)[0][0],
        ffn_norm=_vector(tensors[p + "ffn_norm.weight"]), gate=gate, up=up,
        down=_matrices(tensors, [p + "ffn_down.weight"], plan=plan)[0][0],
        qkv=tuple((matrix, bias[outputs]) for matrix, outputs in qkv),
        gate_up=tuple(matrix for matrix, _ in gate_up))


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Read a Qwen2 GGUF file: checks first (architecture, metadata, tensor types, names, shapes, the data inside the
    file), then the bytes. FileNotFoundError for a missing file; GGUFFileError for one that is not GGUF or is cut
    short; GGUFModelError and quant.UnsupportedTensorType for a GGUF file the engine cannot run."""
    path = Path(path)
    header = read_header(path, string_arrays=())  # no string array is read: the vocabulary is counted, not built
    meta = _Metadata(header.metadata, path)
    architecture = meta.get("general.architecture")
    if architecture != ARCHITECTURE:
        raise GGUFModelError(f"{path}: architecture {architecture!r}; the lean engine runs {ARCHITECTURE} models only")
    table = header.tensors
    if "token_embd.weight" not in table:
        raise GGUFModelError(f"{path}: missing tensors: token_embd.weight")
    config = _config(meta, vocab_size=table["token_embd.weight"].shape[0])
    tied = "output.weight" not in table  # llama.cpp's convention for a model whose head is its embedding
    _check_tensors(path, table, config, tied)
    _check_extents(path, table, header.file_size)

    blob = np.memmap(path, dtype=np.uint8, mode="r")  # read-only; every tensor below is copied out of it
    tensors = {name: _Tensor(t.qtype, t.shape, blob[t.offset:t.end]) for name, t in table.items()}
    plan = plan_for(path, lambda: _plan_classes(tensors, config.layers, tied))
    embedding = _matrices(tensors, ["token_embd.weight"], multiplied=tied, plan=plan, role=HEAD)[0][0]
    layers = [_layer(tensors, i, plan) for i in range(config.layers)]
    output = embedding if tied else _matrices(tensors, ["output.weight"], plan=plan, role=HEAD)[0][0]
    head_layout = plan.verify_layout(HEAD, output.qtype, output.out_features) if plan is not None else None
    layer_classes = set(plan.verify_layouts) - {HEAD} if plan is not None else set()
    return GGUFModel(
        config=config, embedding=embedding, layers=layers, output_norm=_vector(tensors["output_norm.weight"]),
        output=output, path=str(path), plan=plan,
        verify_layers=[_verify_layer(w, plan) for w in layers] if layer_classes else None,
        verify_output=output.in_layout(head_layout) if head_layout not in (None, output.layout) else None)


def _verify_layer(w: LayerWeights, plan: KernelPlan) -> LayerWeights:
    """The layer a pass of 2 rows or more runs: each product call of a class that the plan's verify_layouts name in
    that layout (a copy), the rest (and the per-tensor views, which only count bytes) shared with `w`."""
    def second(matrix: QuantMatrix) -> QuantMatrix:
        layout = plan.verify_layout(matrix.qtype, matrix.qtype, matrix.out_features)
        return matrix if layout is None or layout == matrix.layout else matrix.in_layout(layout)

    return replace(w, o=second(w.o), down=second(w.down), qkv=tuple((second(m), bias) for m, bias in w.qkv),
                   gate_up=tuple(second(m) for m in w.gate_up))


def _plan_classes(tensors: dict, layers: int, tied: bool) -> dict[str, list[QuantMatrix]]:
    """The file's multiplied matrices in its rows, copied out of the memory map as a load copies them (what the
    kernel plan times): the layers' per type, and the head."""
    def copy(name: str) -> QuantMatrix:
        t = tensors[name]
        return QuantMatrix(torch.from_numpy(np.array(_raw_rows(t))), t.qtype, t.shape[-1], name)

    classes: dict[str, list[QuantMatrix]] = {}
    for i in range(layers):
        for kind in LAYER_MATRICES:
            matrix = copy(f"blk.{i}.{kind}.weight")
            classes.setdefault(matrix.qtype, []).append(matrix)
    classes[HEAD] = [copy("token_embd.weight" if tied else "output.weight")]
    return classes
