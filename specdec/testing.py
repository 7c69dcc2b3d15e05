"""Tiny randomly initialised Qwen2-style models for tests and the tiny workflow config (fast, offline)."""

from __future__ import annotations

import gzip
import json
import string
from pathlib import Path

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
        "runtime": {"dtype": "float32", "device": "cpu", "linear_kernel": "auto", "threads": 1},
        "distribution_check": {"temperature": 1.0, "top_k": 4, "tokens": 3, "samples": 1000, "k": [3],
                               "prompts_per_domain": 1, "seed": 0, "alpha": 0.01},
        "distillation": {"prompts_per_domain": 1, "seed": 1, "new_tokens": 6, "top_k": 8,
                         "training": {"steps": 3, "batch_size": 1, "learning_rate": 1e-3}},
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
