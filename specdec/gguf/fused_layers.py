"""The lean forward's decoder layers in one native call (specdec/native/_layers.c) for the few rows of a decoding step
or a verify pass.

Why: in a step of the quantized engine the ~17 Python-level calls per layer around the products cost about 0.5 ms a
layer (docs/quantized.md). `FusedLayers` describes a session's layers once, as a plan (one row of int64 fields per
layer: the addresses and sizes of its weights and of its KV cache, every tensor checked here when the plan is
made), and runs them all in one call per pass. The kernels and their order are the Python forward's (lean._layer):
a row's hidden state comes out the same bits either way (tests/test_layers.py), so batch invariance carries over.
"""

from __future__ import annotations

import torch

from specdec.gguf import quant

try:
    from specdec.native import _layers
except ImportError:  # not built (no compiler at install time)
    _layers = None


def available() -> bool:
    return _layers is not None and _layers.supported() and quant.available()


def _vector(tensor: torch.Tensor, width: int, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32 or tensor.device.type != "cpu" \
            or tuple(tensor.shape) != (width,):
        raise ValueError(f"{what} must be a CPU float32 vector of {width} values, got "
                         f"{getattr(tensor, 'dtype', type(tensor).__name__)} {tuple(getattr(tensor, 'shape', ()))}")
    return tensor.contiguous()


def _matrix(matrix: quant.QuantMatrix, shape: tuple[int, int], codes: dict) -> list[int]:
    if not isinstance(matrix, quant.QuantMatrix) or matrix.shape != shape:
        raise ValueError(f"{getattr(matrix, 'name', matrix)!r}: expected a quantized {shape[0]}x{shape[1]} matrix, "
                         f"got {getattr(matrix, 'shape', type(matrix).__name__)}")
    if matrix.raw.device.type != "cpu" or not matrix.raw.is_contiguous():
        raise ValueError(f"{matrix.name}: the weight's bytes must be a contiguous CPU tensor")
    return [codes[matrix.kernel_type], matrix.raw.data_ptr(), matrix.raw.shape[1]]


class FusedLayers:
    """A session's decoder layers as one native call. layers: the model's `LayerWeights` the session runs; keys and
    values: the session's caches, (layers, kv_heads, max_length, head_dim) fp32; cos and sin: its rotary tables,
    (max_length, 1, head_dim). The plan holds their addresses: this object keeps every tensor it points into."""

    def __init__(self, config, layers, keys: torch.Tensor, values: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor):
        if not available():
            raise RuntimeError("the fused layers need specdec.native._layers and specdec.native._quant (built by the "
                               "install where a C compiler is there) on an x86 CPU with AVX2, FMA and F16C")
        c = self.config = config
        max_length = keys.shape[2] if isinstance(keys, torch.Tensor) and keys.dim() == 4 else -1
        cache_shape = (len(layers), c.kv_heads, max_length, c.head_dim)
        for what, t in (("keys", keys), ("values", values)):
            if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() \
                    or tuple(t.shape) != cache_shape:
                raise ValueError(f"the {what} cache must be a contiguous CPU float32 tensor {cache_shape}, got "
                                 f"{t.dtype} {tuple(t.shape)}")
        self.max_length = max_length
        for what, t in (("cos", cos), ("sin", sin)):
            if t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != (self.max_length, 1, c.head_dim):
                raise ValueError(f"the rotary {what} table must be contiguous float32 ({self.max_length}, 1, "
                                 f"{c.head_dim}), got {t.dtype} {tuple(t.shape)}")
        self.cos, self.sin = cos, sin
        codes, n_fields = _layers.type_codes(), _layers.n_fields()
        self._kept = [keys, values]  # every tensor whose address the plan holds
        rows = []
        for i, w in enumerate(layers):
            row = [self._keep(_vector(w.attn_norm, c.hidden, f"layer {i} attn_norm")),
                   self._keep(_vector(w.ffn_norm, c.hidden, f"layer {i} ffn_norm")), len(w.qkv)]
            qkv = []
            for matrix, bias in w.qkv:
                qkv += _matrix(matrix, (matrix.out_features, c.hidden), codes)
                qkv += [matrix.out_features, self._keep(_vector(bias, matrix.out_features, f"{matrix.name} bias"))]
            row += qkv + [0] * (15 - len(qkv))
            row += _matrix(w.o, (c.hidden, c.hidden), codes)
            row.append(len(w.gate_up))
            gate_up = []
            for matrix in w.gate_up:
                gate_up += _matrix(matrix, (matrix.out_features, c.hidden), codes) + [matrix.out_features]
            row += gate_up + [0] * (8 - len(gate_up))
            row += _matrix(w.down, (c.hidden, c.ffn), codes)
            row += [keys[i].data_ptr(), values[i].data_ptr()]
            rows.append(row)
        self._kept += [m.raw for w in layers for m in [*(m for m, _ in w.qkv), w.o, *w.gate_up, w.down]]
        self.plan = torch.tensor(rows, dtype=torch.int64).reshape(len(layers), n_fields)
        self.scale = c.head_dim ** -0.5

    def _keep(self, tensor: torch.Tensor) -> int:
        self._kept.append(tensor)
        return tensor.data_ptr()

    def forward(self, hidden: torch.Tensor, start: int, layer_seconds: torch.Tensor | None = None,
                layers: range | None = None) -> torch.Tensor:
        """Every layer over hidden (rows, hidden) fp32 at positions start..start+rows-1, in place (returned); their
        keys and values written into the caches. layer_seconds: None, or a float64 vector of one value per layer
        that gets each layer's wall time, measured in C around it (the cost model's profiles). layers: a run of
        consecutive layers (range(a, b)) to apply instead of all (a session keeping some layers' outputs calls
        once per run between them; each layer's row of the plan is self-contained)."""
        c = self.config
        if not isinstance(hidden, torch.Tensor) or hidden.dtype != torch.float32 or hidden.device.type != "cpu" \
                or hidden.dim() != 2 or hidden.shape[1] != c.hidden or not hidden.is_contiguous():
            raise ValueError(f"the fused layers take contiguous CPU float32 rows of {c.hidden} values, got "
                             f"{getattr(hidden, 'dtype', type(hidden).__name__)} "
                             f"{tuple(getattr(hidden, 'shape', ()))}")
        if not isinstance(start, int) or start < 0 or start + hidden.shape[0] > self.max_length:
            raise ValueError(f"positions {start}..{start + hidden.shape[0] - 1} lie outside the cache's "
                             f"{self.max_length}")
        plan = self.plan
        if plan.dtype != torch.int64 or plan.dim() != 2 or not plan.is_contiguous() \
                or plan.shape[1] != _layers.n_fields():
            raise ValueError(f"the layer plan must be a contiguous int64 (layers, {_layers.n_fields()}) tensor, got "
                             f"{plan.dtype} {tuple(plan.shape)}")
        if layer_seconds is not None and (not isinstance(layer_seconds, torch.Tensor)
                                          or layer_seconds.dtype != torch.float64
                                          or layer_seconds.device.type != "cpu"
                                          or tuple(layer_seconds.shape) != (plan.shape[0],)
                                          or not layer_seconds.is_contiguous()):
            raise ValueError(f"layer_seconds must be a contiguous CPU float64 vector of {plan.shape[0]} values (one "
                             f"per layer), got {getattr(layer_seconds, 'dtype', type(layer_seconds).__name__)} "
                             f"{tuple(getattr(layer_seconds, 'shape', ()))}")
        n_layers = plan.shape[0]
        if layers is None:
            layers = range(n_layers)
        if not isinstance(layers, range) or layers.step != 1 or not 0 <= layers.start < layers.stop <= n_layers:
            raise ValueError(f"layers must be a non-empty range(a, b) within range(0, {n_layers}), got {layers!r}")
        row_bytes = plan.shape[1] * plan.element_size()
        seconds_at = 0 if layer_seconds is None else \
            layer_seconds.data_ptr() + layers.start * layer_seconds.element_size()
        _layers.forward(plan.data_ptr() + layers.start * row_bytes, len(layers), plan.shape[1], hidden.data_ptr(),
                        hidden.shape[0], start, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, self.max_length,
                        self.cos.data_ptr(), self.sin.data_ptr(), float(c.rms_eps), float(self.scale),
                        torch.get_num_threads(), seconds_at, quant.kernel_name())
        return hidden
