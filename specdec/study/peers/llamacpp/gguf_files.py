"""GGUF files: the facts a step's cost depends on (layers, bytes read per step), and exporting a prepared
safetensors draft as a GGUF next to its base file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from specdec.study.prepare.wheels import Log
from .errors import LlamaCppError


def gguf_facts(path: str | os.PathLike) -> dict:
    """Layers and the bytes one decoding step reads from a GGUF's tensor table.

    step_bytes: every tensor, except that the token embedding is only looked up (one row per token) when the model has
    a separate output matrix; with a tied head the embedding is the LM head and is read whole.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    tensors = {t.name: t for t in reader.tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    embd = tensors.get("token_embd.weight")
    tied = "output.weight" not in tensors
    step = total if tied or embd is None else total - int(embd.n_bytes) + int(embd.n_bytes) // int(embd.shape[-1])
    types = {}
    for t in tensors.values():
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + int(t.n_bytes)
    name = reader.fields["general.name"].contents() if "general.name" in reader.fields else Path(path).stem
    return {"file": Path(path).name, "general_name": name, "architecture": arch, "n_layers": layers,
            "tensor_bytes": total, "step_bytes": step, "tied_head": tied, "bytes_by_type": types}


# --------------------------------------------------------------------------------------------------- GGUF export
def _field_value(f):
    from gguf import GGUFValueType

    value = f.contents()
    main = f.types[0]
    sub = f.types[-1] if main == GGUFValueType.ARRAY else None
    return value, main, sub


def export_gguf(model_dir: str | os.PathLike, base_gguf: str | os.PathLike, out: str | os.PathLike,
                log: Log = print) -> dict:
    """A prepared safetensors model (a truncated or distilled draft: the first layers of `base_gguf`'s model, maybe
    retrained) written as a GGUF with the base file's metadata, tokenizer and chat template.

    Each tensor equal to the dequantised base tensor of the same name is copied in its original quantised form (a
    truncated draft is then an exact cut of the base file); a changed tensor is quantised by the `gguf` package in the
    base tensor's type where that package can quantise it (Q8_0, Q5_0, Q4_0, BF16, F16/F32), else in Q8_0 (it cannot
    make K-quants: Q4_K, Q6_K tensors that training changed become Q8_0, so such a draft reads more bytes than a
    K-quantised one would). Returns {tensor name: how it was written}.
    """
    import gguf
    from safetensors.torch import load_file

    model_dir, out = Path(model_dir), Path(out)
    cfg = json.loads((model_dir / "config.json").read_text())
    n_layers = int(cfg["num_hidden_layers"])
    reader = gguf.GGUFReader(str(base_gguf))
    arch = reader.fields["general.architecture"].contents()
    base_layers = int(reader.fields[f"{arch}.block_count"].contents())
    if not 1 <= n_layers <= base_layers:
        raise LlamaCppError(f"{model_dir} has {n_layers} layers; its base GGUF {base_gguf} has {base_layers}")
    base = {t.name: t for t in reader.tensors}
    state = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    name_map = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), n_layers)
    partial = Path(str(out) + ".partial")
    try:
        how = _write_export(gguf, reader, state, name_map, base, partial, arch, n_layers, model_dir.name)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    log(f"exported {out}: {n_layers} layers; " + ", ".join(f"{v}: {list(how.values()).count(v)}"
                                                           for v in sorted(set(how.values()))))
    return how


def _write_export(gguf, reader, state: dict, name_map, base: dict, path: Path, arch: str, n_layers: int,
                  name: str) -> dict:
    import torch
    from gguf import GGMLQuantizationType as Q

    quantisable = {Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1, Q.BF16}
    writer = gguf.GGUFWriter(str(path), arch)
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        value, main, sub = _field_value(f)
        if f.name == f"{arch}.block_count":
            value = n_layers
        elif f.name == "general.name":
            value = f"{value} (first {n_layers} layers, {name})"
        writer.add_key_value(f.name, value, main, sub_type=sub)
    how = {}
    for hf_name, tensor in state.items():
        gg = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg is None:
            raise LlamaCppError(f"{name}: no GGUF name for tensor {hf_name}")
        ref = base.get(gg)
        data = tensor.to(torch.float32).numpy()
        if ref is not None:
            ref_values = gguf.quants.dequantize(ref.data, ref.tensor_type).reshape(data.shape)
            if np.array_equal(ref_values, data):
                writer.add_tensor(gg, np.asarray(ref.data), raw_shape=list(ref.data.shape), raw_dtype=ref.tensor_type)
                how[gg] = f"copied {ref.tensor_type.name}"
                continue
        qtype = ref.tensor_type if ref is not None else Q.Q8_0
        if data.ndim == 1 or qtype in (Q.F32, Q.F16):
            qtype = Q.F32 if data.ndim == 1 else qtype
            arr = data.astype(np.float32 if qtype == Q.F32 else np.float16)
            writer.add_tensor(gg, arr, raw_dtype=qtype)
        else:
            if qtype not in quantisable:
                qtype = Q.Q8_0
            q = gguf.quants.quantize(data, qtype)
            writer.add_tensor(gg, q, raw_shape=list(q.shape), raw_dtype=qtype)
        how[gg] = f"quantised {qtype.name}"
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return how
