"""Tiny randomly initialised Qwen2-style models for tests and the tiny workflow config (fast, offline)."""

from __future__ import annotations

import gzip
import json
import string
from pathlib import Path
from typing import Sequence

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    init_std: float = 0.5,
    dtype: torch.dtype = torch.float64,
    eos_token_id: int | None = None,
) -> Qwen2ForCausalLM:
    """A random Qwen2 causal LM. A large init_std gives peaked next-token distributions (a real model's are),
    so greedy paths are not decided by near-ties; float64 keeps one-token and multi-token passes equal to ~1e-15."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init_std,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = eos_token_id
    return model


def perturbed_copy(model: Qwen2ForCausalLM, noise: float, seed: int = 1) -> Qwen2ForCausalLM:
    """A draft that mostly agrees with `model`: the same weights plus relative Gaussian noise."""
    copy = Qwen2ForCausalLM(model.config).to(next(model.parameters()).dtype).eval()
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(noise * parameter.std() * torch.randn(parameter.shape, generator=generator,
                                                                  dtype=parameter.dtype))
    copy.generation_config.eos_token_id = model.generation_config.eos_token_id
    return copy


# --- tiny GGUF files for the quantized engine (specdec/gguf/lean.py) --------------------------------------------------
# Tensor types per kind, as the study's two files hold them (the 1.5B target: Q4_K with Q6_K for the head, attn_v and
# ffn_down; the 0.5B draft: Q5_0 with Q8_0 for the head and attn_v, Q6_K for ffn_down). A key "blk.N.kind" sets
# one layer's tensor (the 1.5B file mixes Q4_K and Q6_K across layers for attn_v and ffn_down).
TARGET_TYPES = {"token_embd": "Q4_K", "attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
                "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K", "output": "Q6_K"}
DRAFT_TYPES = {"token_embd": "Q5_0", "attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q5_0",
               "ffn_gate": "Q5_0", "ffn_up": "Q5_0", "ffn_down": "Q6_K", "output": "Q8_0"}


def _gguf_bytes(qtype: str, out_features: int, in_features: int, seed: int):
    """Valid random bytes of a tensor type: `random_quant_matrix` for the engine's types, the gguf package's own
    quantiser for any other (a file the loader must refuse)."""
    import numpy as np

    from specdec.gguf.quant import BLOCKS, random_quant_matrix

    if qtype in BLOCKS:
        return random_quant_matrix(qtype, out_features, in_features, seed).raw.numpy()
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    values = np.random.default_rng(seed).standard_normal((out_features, in_features)).astype(np.float32)
    return quantize(values, GGMLQuantizationType[qtype])


def tiny_gguf(path, types: dict[str, str] | None = None, layers: int = 2, hidden: int = 256, ffn: int = 512,
              heads: int = 4, kv_heads: int = 2, vocab_size: int = 256, seed: int = 0, eos_token_id: int = 1,
              rope_theta: float = 1e6, rms_eps: float = 1e-6, architecture: str = "qwen2",
              norm_scale: float | Sequence[float] = 0.1, tied: bool = False, drop: Sequence[str] = (),
              metadata: dict | None = None):
    """Write a tiny random Qwen2 GGUF file with the real files' metadata keys; returns its path.

    types: tensor kind (or "blk.N.kind") -> ggml type, over TARGET_TYPES (K-quants need rows of a multiple of 256
    values, Q5_0 and Q8_0 of 32). Each tensor's values are drawn from (seed, its name), so a file with fewer layers
    holds the same first layers. norm_scale: the layer norms' weights (random around it; the output norm is around
    1), one value or one per layer: the random matrices' values reach +-2, so norms near 1 would make every
    product's output ~16x its input and the attention one-hot, where the 8-bit activation rounding flips it; 0.1
    keeps a tiny model about as smooth as a real one, and smaller later layers make a model whose first layers
    nearly agree with it. tied: no output.weight (the head is the embedding). drop: tensor names left out; metadata:
    keys under the architecture's prefix overridden, or left out where None (broken files for the loader's checks)."""
    import zlib

    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    types = {**TARGET_TYPES, **(types or {})}
    seed_of = lambda name: zlib.crc32(f"{seed}:{name}".encode())  # noqa: E731
    kv = hidden // heads * kv_heads
    scales = [norm_scale] * layers if isinstance(norm_scale, (int, float)) else list(norm_scale)
    matrices = {"token_embd": (vocab_size, hidden)}
    vectors = {"output_norm.weight": (hidden, 1.0)}
    for i in range(layers):
        matrices.update({f"blk.{i}.attn_q": (hidden, hidden), f"blk.{i}.attn_k": (kv, hidden),
                         f"blk.{i}.attn_v": (kv, hidden), f"blk.{i}.attn_output": (hidden, hidden),
                         f"blk.{i}.ffn_gate": (ffn, hidden), f"blk.{i}.ffn_up": (ffn, hidden),
                         f"blk.{i}.ffn_down": (hidden, ffn)})
        vectors.update({f"blk.{i}.attn_norm.weight": (hidden, scales[i]),
                        f"blk.{i}.ffn_norm.weight": (hidden, scales[i]), f"blk.{i}.attn_q.bias": (hidden, 0.0),
                        f"blk.{i}.attn_k.bias": (kv, 0.0), f"blk.{i}.attn_v.bias": (kv, 0.0)})
    if not tied:
        matrices["output"] = (vocab_size, hidden)
    a = architecture
    keys = {"block_count": layers, "context_length": 4096, "embedding_length": hidden, "feed_forward_length": ffn,
            "attention.head_count": heads, "attention.head_count_kv": kv_heads, "rope.freq_base": float(rope_theta),
            "attention.layer_norm_rms_epsilon": float(rms_eps), **(metadata or {})}
    writer = GGUFWriter(str(path), architecture)
    for key, value in keys.items():
        if value is None:  # a key left out
            continue
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(f"{a}.{key}", value)
    writer.add_eos_token_id(eos_token_id)
    for stem, (out_features, in_features) in matrices.items():
        name = f"{stem}.weight"
        if name in drop:
            continue
        qtype = types.get(stem, types[stem.split(".")[-1]])
        raw = _gguf_bytes(qtype, out_features, in_features, seed_of(name))
        if qtype in ("F32", "F16"):
            writer.add_tensor(name, raw.view(np.float32 if qtype == "F32" else np.float16).reshape(out_features, -1))
        else:
            writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[qtype])
    for name, (size, centre) in vectors.items():
        if name not in drop:  # norms around their centre, biases small
            noise = np.random.default_rng(seed_of(name)).standard_normal(size)
            writer.add_tensor(name, (centre * (1 + 0.1 * noise) if centre else 0.1 * noise).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_reference(model) -> Qwen2ForCausalLM:
    """A Hugging Face Qwen2ForCausalLM (fp32) holding a GGUFModel's dequantised weights: the model the lean forward
    must compute (tests only: it materialises every matrix in fp32)."""
    c = model.config
    config = Qwen2Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden, intermediate_size=c.ffn, num_hidden_layers=c.layers,
        num_attention_heads=c.heads, num_key_value_heads=c.kv_heads, rms_norm_eps=c.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, max_position_embeddings=4096,
        tie_word_embeddings=False, eos_token_id=sorted(c.eos_token_ids) or None, bos_token_id=None, pad_token_id=None)
    hf = Qwen2ForCausalLM(config).float().eval()
    state = {"model.embed_tokens.weight": model.embedding.dequantize_rows(), "model.norm.weight": model.output_norm,
             "lm_head.weight": model.output.dequantize_rows()}
    for i, w in enumerate(model.layers):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": w.attn_norm, p + "post_attention_layernorm.weight": w.ffn_norm,
            p + "self_attn.q_proj.weight": w.q.dequantize_rows(), p + "self_attn.q_proj.bias": w.q_bias,
            p + "self_attn.k_proj.weight": w.k.dequantize_rows(), p + "self_attn.k_proj.bias": w.k_bias,
            p + "self_attn.v_proj.weight": w.v.dequantize_rows(), p + "self_attn.v_proj.bias": w.v_bias,
            p + "self_attn.o_proj.weight": w.o.dequantize_rows(), p + "mlp.gate_proj.weight": w.gate.dequantize_rows(),
            p + "mlp.up_proj.weight": w.up.dequantize_rows(), p + "mlp.down_proj.weight": w.down.dequantize_rows()})
    hf.load_state_dict(state, strict=True)
    return hf


# --- a tiny tokenizer and a tiny study (models + prompt files + config) for the workflow tests -------------------
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Byte-level characters ("Ġ" is the space): for a qwen2 config AutoTokenizer always builds a Qwen2Tokenizer (byte-level
# BPE) from the saved vocabulary, whatever tokenizer.json holds, so a WordLevel tokenizer would not survive a reload.
CHARS = ["Ġ"] + list(string.ascii_lowercase) + list(string.ascii_uppercase) + list("01234567")
TINY_VOCAB = len(SPECIALS) + len(CHARS)  # 64
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def tiny_tokenizer(chars: list[str] | None = None):
    """A character-level byte-level BPE tokenizer (no merges) of exactly TINY_VOCAB tokens, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + (chars or CHARS))}
    if len(vocab) != TINY_VOCAB:
        raise ValueError(f"a tiny tokenizer needs {TINY_VOCAB} distinct tokens, got {len(vocab)}")
    backend = Tokenizer(models.BPE(vocab, [], unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_model_source(directory: Path, model, tokenizer) -> Path:
    """A directory that a `local` model source can point at: safetensors + config + tokenizer."""
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


TINY_QUESTIONS = {
    "writing": ["Write a short poem about the sea", "Describe a quiet morning in a small town"],
    "coding": ["Write a function that reverses a list", "Explain what a Python decorator does"],
    "stem": ["Why is the sky blue", "What is the speed of light"],
}


def build_tiny_study(root: Path, k: list[int] | None = None, drafts: int = 1) -> dict:
    """Write tiny random target/draft model sources, two prompt files in the real formats (MT-bench jsonl,
    HumanEval jsonl.gz) and a config for them under `root`; return the config (also written to root/config.yaml)."""
    import yaml

    root = Path(root)
    target = tiny_qwen2(vocab_size=TINY_VOCAB, hidden_size=32, seed=0, dtype=torch.float32, init_std=0.3)
    tok = tiny_tokenizer()
    models = {"tiny-target": {"source": "local", "path": str(save_model_source(root / "src/tiny-target", target,
                                                                               tok))}}
    for i in range(drafts):
        draft = perturbed_copy(target, noise=0.05 * (i + 1), seed=i + 1)
        models[f"tiny-draft{i}"] = {"source": "local",
                                    "path": str(save_model_source(root / f"src/tiny-draft{i}", draft, tok))}
    # A wider model, profiled only (profiling.extra_models): the cost-model fit needs two layer widths.
    wide = tiny_qwen2(vocab_size=TINY_VOCAB, hidden_size=64, seed=9, dtype=torch.float32, init_std=0.3)
    models["tiny-wide"] = {"source": "local", "path": str(save_model_source(root / "src/tiny-wide", wide, tok))}
    pairs = [(category, text) for category, texts in TINY_QUESTIONS.items() for text in texts]
    questions = [{"question_id": 100 + i, "category": category, "turns": [text, "and more?"]}
                 for i, (category, text) in enumerate(pairs)]
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src/questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    problems = [{"task_id": f"HumanEval/{i}", "prompt": f"def add{i}(a, b):\n    "} for i in range(3)]
    with gzip.open(root / "src/HumanEval.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(p) + "\n" for p in problems))
    config = {
        "target": "tiny-target",
        "drafts": [f"tiny-draft{i}" for i in range(drafts)],
        "models": models,
        "prompt_sources": {"humaneval": {"path": str(root / "src/HumanEval.jsonl.gz"), "format": "humaneval"},
                           "mtbench": {"path": str(root / "src/questions.jsonl"), "format": "mtbench"}},
        "domains": {"code": {"sources": [{"set": "humaneval"}, {"set": "mtbench", "categories": ["coding"]}]},
                    "prose": {"sources": [{"set": "mtbench", "categories": ["writing"]}]}},
        "prompts": {"per_domain": 2, "seed": 0, "max_prompt_tokens": 256, "use_chat_template": True},
        "decoding": {"k": k or [1, 3], "max_new_tokens": 8, "repeats": 2, "greedy": True,
                     "sampled": {"temperature": 0.8, "top_p": 0.9, "top_k": None, "seeds": [0], "k": [3]}},
        "runtime": {"dtype": "float32", "device": "cpu", "linear_kernel": "invariant", "threads": 1},
        "distribution_check": {"temperature": 1.0, "top_k": 4, "tokens": 3, "samples": 1000, "k": [3],
                               "prompts_per_domain": 1, "seed": 0, "alpha": 0.01},
        "distillation": {"prompts_per_domain": 1, "seed": 1, "new_tokens": 6, "top_k": 8,
                         "training": {"steps": 3, "batch_size": 1, "learning_rate": 1e-3}},
        "feature_head": {"data": {"prompts_per_domain": 1, "seed": 2, "new_tokens": 6, "engine": "safetensors"}},
        "peers": {"k": [3], "prompts_per_domain": 1, "repeats": 1, "domains": ["code"]},
        "reproduce": {"drafts": ["tiny-draft0"], "domains": ["code"], "k": [(k or [1, 3])[0]], "repeats": 2,
                      "prompts_per_domain": 1},
        "profiling": {"context_length": 16, "repeats": 3, "warmup": 1, "n_boot": 50, "audit_tolerance": 0.10,
                      "kernel_repeats": 1, "kernel_rows": max(k or [1, 3]) + 1, "extra_models": ["tiny-wide"]},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".tiny")
    build_tiny_study(out)
    print(f"tiny study in {out}: snakemake --cores 1 --directory {out} --configfile {out}/config.yaml")


# --- tiny GGUF files with a tokenizer, and a tiny study in the gguf regime (runtime.weights: gguf) ---------------
def _gguf_string(text: str) -> bytes:
    import struct

    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _gguf_kv_bytes(fields: dict) -> bytes:
    """GGUF metadata entries: bool, uint32, string, a list of strings or of int32 (the types tokenizers use)."""
    import struct

    out = bytearray()
    for key, value in fields.items():
        out += _gguf_string(key)
        if isinstance(value, bool):
            out += struct.pack("<I?", 7, value)
        elif isinstance(value, int):
            out += struct.pack("<II", 4, value)
        elif isinstance(value, str):
            out += struct.pack("<I", 8) + _gguf_string(value)
        elif all(isinstance(v, str) for v in value):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_gguf_string(v) for v in value)
        else:
            out += struct.pack("<IIQ", 9, 5, len(value)) + struct.pack(f"<{len(value)}i", *value)
    return bytes(out)


def add_gguf_metadata(path, fields: dict, dest=None):
    """Rewrite a GGUF file (to dest, default in place) with more metadata entries: the header's entry count, the
    new entries after the old, the tensor table as it was, the data realigned (tensor offsets are relative to it,
    so they stay valid). Keys the file already has are refused."""
    import struct

    from specdec.gguf.header import read_header

    header = read_header(path, string_arrays=())
    present = sorted(set(fields) & set(header.metadata))
    if present:
        raise ValueError(f"{path} already has metadata {present}")
    raw = Path(path).read_bytes()
    prefix = (raw[:4] + struct.pack("<IQQ", header.version, len(header.tensors), len(header.metadata) + len(fields))
              + raw[24:header.kv_end] + _gguf_kv_bytes(fields) + raw[header.kv_end:header.table_end])
    alignment = int(header.metadata.get("general.alignment", 32))
    Path(dest or path).write_bytes(prefix + bytes(-len(prefix) % alignment) + raw[header.data_start:])
    return dest or path


def gguf_tokenizer_fields(tokenizer=None, chat_template: str = CHAT_TEMPLATE) -> dict:
    """A tokenizer as llama.cpp's converter writes a Qwen2 one into GGUF metadata (byte-level BPE, "gpt2" model,
    specials as control tokens), the EOS id left to the file's writer; default: the tiny tokenizer (no merges)."""
    tok = tokenizer or tiny_tokenizer()
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tok.all_special_tokens)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if t in special else 1 for t in tokens],
            "tokenizer.ggml.merges": [], "tokenizer.ggml.padding_token_id": vocab[tok.pad_token],
            "tokenizer.ggml.bos_token_id": vocab[tok.pad_token], "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": chat_template}


def tiny_gguf_with_tokenizer(path, tokenizer=None, **kwargs):
    """tiny_gguf (vocab_size: the tokenizer's) with the tokenizer in its metadata: a file the CLI and the gguf
    regime run alone (tokenizer from the file, vocabularies compared between files). kwargs: tiny_gguf's."""
    tok = tokenizer or tiny_tokenizer()
    vocab = tok.get_vocab()
    tiny_gguf(path, vocab_size=len(vocab), eos_token_id=vocab[tok.eos_token], **kwargs)
    return add_gguf_metadata(path, gguf_tokenizer_fields(tok))


# The tiny gguf study: a 2-layer target whose second layer is ~30x smaller than its first, and a 1-layer draft file
# holding the same first layer, embedding and head (tiny_gguf draws each tensor from its name), so the draft is often
# right; both with the target's tensor types.
GGUF_TARGET_SCALES = (0.1, 0.003)


def build_tiny_gguf_study(root: Path, k: list[int] | None = None) -> dict:
    """The tiny study (build_tiny_study: prompt sources, domains, settings) in the gguf regime: tiny GGUF files with
    the tiny tokenizer at root/resources/gguf/{model}.gguf (where the workflow reads them; no rule makes a local
    model's GGUF file), runtime.weights gguf, every kind that runs there, and the stages that do not (the
    distribution check, profiling and the cost model, peers, the sweep) unset. Returns the config (also written to
    root/config.yaml)."""
    import yaml

    root = Path(root)
    config = build_tiny_study(root, k=k or [1, 3])
    gguf_dir = root / "resources/gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    tiny_gguf_with_tokenizer(gguf_dir / "tiny-target.gguf", layers=2, norm_scale=GGUF_TARGET_SCALES)
    tiny_gguf_with_tokenizer(gguf_dir / "tiny-draft0.gguf", layers=1, norm_scale=GGUF_TARGET_SCALES[:1])
    config["models"] = {name: spec for name, spec in config["models"].items() if name in ("tiny-target",
                                                                                          "tiny-draft0")}
    config["draft_kinds"] = {"trunc1": {"kind": "truncated", "model": "tiny-target", "layers": 1},
                             "early1": {"kind": "early_exit", "layers": 1},
                             "lookup": {"kind": "prompt_lookup", "ngram_max": 3},
                             "hybrid": {"kind": "hybrid", "model": "tiny-draft0", "ngram_max": 3}}
    config["drafts"] = ["tiny-draft0", *config["draft_kinds"]]
    config["runtime"] = {"weights": "gguf", "dtype": "float32", "device": "cpu", "threads": 1}
    config["reproduce"] = {"drafts": ["tiny-draft0"], "domains": ["code"], "k": [config["decoding"]["k"][0]],
                           "repeats": 1, "prompts_per_domain": 1}
    for stage in ("distribution_check", "profiling", "peers", "distillation"):
        config.pop(stage)  # left out, not null: the schema's defaults inside them do not take a null
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


# --- batch invariance: a position's logits in one-token steps and in passes of every size ------------------------
def step_and_pass_logits(session, tokens: list[int], prompt_length: int, steps: int):
    """Logits of positions prompt_length .. + steps - 1 from one-token steps after a prompt pass, and from passes
    over every m of 1..steps at several offsets, as (offset, m, logits). Before a pass, the tokens since the prompt
    are fed in passes of 3 (as accepted blocks are): their keys and values must be the same bits as the steps'.
    `session`: anything speaking the session verbs (lm.CachedLM over a model, lean.LeanLM)."""
    session.reset()
    session.extend(tokens[:prompt_length], 1)
    single = torch.stack([session.extend([t], 1)[0] for t in tokens[prompt_length:prompt_length + steps]])
    passes = []
    for m in range(1, steps + 1):
        for offset in range(0, steps - m + 1, max(1, (steps - m) // 3) if steps > m else 1):
            session.reset()
            session.extend(tokens[:prompt_length], 1)
            for start in range(prompt_length, prompt_length + offset, 3):
                session.extend(tokens[start:min(start + 3, prompt_length + offset)], 1)
            passes.append((offset, m, session.extend(tokens[prompt_length + offset:prompt_length + offset + m], m)))
    return single, passes


def count_differing_rows(single, passes) -> tuple[int, int]:
    """(rows whose logits differ in any bit from the one-token step's, rows compared)."""
    rows = [torch.equal(logits[j], single[offset + j]) for offset, m, logits in passes for j in range(m)]
    return rows.count(False), len(rows)


def at_threads(threads: int, run):
    """run() on `threads` torch threads (the native kernels' OpenMP path follows torch's count), then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return run()
    finally:
        torch.set_num_threads(before)


def example_spec(kind) -> dict:
    """A draft kind's (DraftKind's) smallest spec: its required fields filled from their schema (the smallest
    integer allowed, a model's name), as the registry's shared tests build every kind."""
    spec = {"kind": kind.name}
    for field in kind.required:
        schema = kind.fields[field]
        spec[field] = {"integer": schema.get("minimum", 1), "number": schema.get("minimum", 0.0),
                       "string": "draft"}[schema["type"]]
    return spec
