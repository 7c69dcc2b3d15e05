"""The GPU regime in one short script (issue 48, item 4): on random weights of the real pair's shapes (a step costs
the same whatever its weights; real weights cannot travel to a lent GPU), the fixed-shape session's one-token step
against the bandwidth floor (the weights' bytes over the read bandwidth every machine's floor uses), T(m)/T(1) for
verify passes of m <= R rows, c of the 0.5B shape and of a one-layer stand-in of the feature head, rows differing
between a step and verify passes (fixed session and CachedLM), greedy identity of speculative decoding through fixed
sessions, and Hugging Face's static-cache generate (compiled on cuda) on the same shapes. Writes gpu_regime.json
(every figure, with the machine's record) under --out.

    python bench/gpu_regime.py --device cuda --out results/machines/<gpu id>/gpu_regime
    python bench/gpu_regime.py --device cpu --tiny --out /tmp/gpu-smoke      (the same code on tiny shapes)

The architectures are config/random-weights.yaml's (the two models' own configs). Timings: medians over --repeats
after a warm-up, each pass synchronised; step and passes interleaved per repeat so that drift hits every m alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from specdec.study.cost.profiling import memory_bandwidth, param_bytes, random_weights_model, sync_for

REPO = Path(__file__).resolve().parents[1]
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
HEAD_VOCAB = 8192  # the feature head's drafting vocabulary (config/heads.yaml)
TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": False}


def architectures(tiny: bool) -> dict:
    """The target's, the 0.5B draft's and the head stand-in's configs (one target-shaped layer, 8192 tokens)."""
    if tiny:
        found = {TARGET: TINY, DRAFT: {**TINY, "hidden_size": 32, "num_hidden_layers": 3}}
    else:
        found = yaml.safe_load((REPO / "config/random-weights.yaml").read_text())["profiling"]["architectures"]
    target = found[TARGET]
    return {"target": target, "draft": found[DRAFT],
            "head": {**target, "num_hidden_layers": 1, "vocab_size": min(HEAD_VOCAB, target["vocab_size"])}}


def weight_bytes(model) -> int:
    """Bytes a step reads: every parameter but the input embedding (a step gathers one of its rows)."""
    return param_bytes(model) - param_bytes(model.get_input_embeddings())


def pass_times(session, context: int, rows: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of a pass of m new positions after `context` cached ones, per m (interleaved per repeat)."""
    tokens = torch.randint(0, session.vocab_size, (context + max(rows),), generator=torch.Generator().manual_seed(1))
    sync = sync_for(session.device)
    session.reset()
    session.extend(tokens[:context].tolist(), 1)
    times = {m: [] for m in rows}
    for repeat in range(repeats + 1):  # the first round warms up (captures, compiles)
        for m in rows:
            feed = tokens[context:context + m].tolist()
            sync()
            start = time.perf_counter()
            session.extend(feed, m)
            sync()
            if repeat:
                times[m].append(time.perf_counter() - start)
            session.crop(context)
    return {m: statistics.median(t) for m, t in times.items()}


def differing_rows(session, vocab: int, rows: int) -> dict:
    from specdec.testing import count_differing_rows, step_and_pass_logits

    tokens = torch.randint(0, vocab, (24 + rows,), generator=torch.Generator().manual_seed(2)).tolist()
    single, passes = step_and_pass_logits(session, tokens, prompt_length=20, steps=rows)
    differing, compared = count_differing_rows(single, passes)
    return {"differing": differing, "compared": compared}


def greedy_identity(target, draft, vocab: int, prompts: int, new_tokens: int, k: int) -> dict:
    from specdec.decode import generate_baseline, generate_speculative
    from specdec.drafts import ModelDraft

    identical = 0
    for p in range(prompts):
        ids = torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(10 + p))
        plain = generate_baseline(target, ids, new_tokens)
        spec = generate_speculative(target, ModelDraft(draft), ids, k=k, max_new_tokens=new_tokens)
        identical += plain.tokens == spec.tokens
    return {"identical": identical, "sequences": prompts, "k": k, "new_tokens": new_tokens}


def hf_static_generate(model, vocab: int, new_tokens: int, device: str, compiled: bool) -> float | None:
    """Tokens/s of Hugging Face's greedy generate with a static cache (compiled where asked): the reference a GPU
    user would pick; None where it cannot run here."""
    ids = torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(3)).to(device)
    sync = sync_for(torch.device(device))
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False,
              "cache_implementation": "static"}
    if compiled:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    try:
        model.generate(ids, **kwargs)  # warm-up: captures and compiles
        sync()
        start = time.perf_counter()
        model.generate(ids, **kwargs)
        sync()
    except Exception as e:  # noqa: BLE001  (a reference, not ours: its failure is reported, not fatal)
        print(f"gpu_regime: Hugging Face static-cache generate failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return new_tokens / (time.perf_counter() - start)


def run(args) -> dict:
    from specdec.fixed_shape import FixedShapeLM
    from specdec.lm import CachedLM
    from specdec.study.machine import machine_record

    device, rows = args.device, args.rows
    shapes = architectures(args.tiny)
    models = {name: random_weights_model(arch, args.dtype, device, seed=i)
              for i, (name, arch) in enumerate(shapes.items())}
    length = args.context + rows + 64
    fixed = {name: FixedShapeLM(model, max_length=length, rows=rows) for name, model in models.items()}
    ms = list(range(1, rows + 1))
    target_times = pass_times(fixed["target"], args.context, ms, args.repeats)
    step = {name: pass_times(session, args.context, [1], args.repeats)[1] for name, session in fixed.items()}
    bandwidth = memory_bandwidth(args.buffer_mb * 2**20, args.repeats, device)
    floor = weight_bytes(models["target"]) / bandwidth
    eager = pass_times(CachedLM(models["target"]), args.context, [1, rows], args.repeats)
    vocab = shapes["target"]["vocab_size"]
    result = {
        "machine": machine_record(torch.get_num_threads(), device=device), "dtype": args.dtype, "rows": rows,
        "context": args.context, "repeats": args.repeats, "shapes": shapes, "graphs": fixed["target"].graphs,
        "bandwidth_bytes_per_s": bandwidth, "target_weight_bytes": weight_bytes(models["target"]),
        "floor_ms": floor * 1e3, "target_step_ms": step["target"] * 1e3,
        "step_over_floor": step["target"] / floor,
        "verify_over_step": {m: t / target_times[1] for m, t in target_times.items()},
        "c": {"0.5b": step["draft"] / step["target"], "head_stand_in": step["head"] / step["target"]},
        "bytes_ratio": {"0.5b": weight_bytes(models["draft"]) / weight_bytes(models["target"]),
                        "head_stand_in": weight_bytes(models["head"]) / weight_bytes(models["target"])},
        "depth_ratio": {"0.5b": shapes["draft"]["num_hidden_layers"] / shapes["target"]["num_hidden_layers"],
                        "head_stand_in": 1 / shapes["target"]["num_hidden_layers"]},
        "cached_eager": {"step_ms": eager[1] * 1e3, f"pass_{rows}_over_step": eager[rows] / eager[1]},
        "differing_rows": {"fixed": differing_rows(fixed["target"], vocab, rows),
                           "cached": differing_rows(CachedLM(models["target"]), vocab, rows)},
        "greedy_identity": greedy_identity(fixed["target"], fixed["draft"], vocab, args.prompts, args.new_tokens,
                                           args.k),
    }
    result["ours_tokens_per_s_plain"] = 1 / step["target"]
    result["hf_static_tokens_per_s"] = hf_static_generate(models["target"], vocab, args.new_tokens, device,
                                                          compiled=device.startswith("cuda") and not args.no_compile)
    # the seed's question on this machine: c = s x depth ratio + (1 - s) x bytes ratio, solved for the 0.5B's s
    depth, byte_ratio, c = result["depth_ratio"]["0.5b"], result["bytes_ratio"]["0.5b"], result["c"]["0.5b"]
    result["s_0.5b"] = (c - byte_ratio) / (depth - byte_ratio) if depth != byte_ratio else None
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    parser.add_argument("--rows", type=int, default=16, help="rows of every fixed-shape pass (runtime.session_rows)")
    parser.add_argument("--context", type=int, default=256, help="cached positions before the timed passes")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--buffer-mb", type=int, default=2048,
                        help="the read-bandwidth buffer's size (profiling.memory_bandwidth, as every machine's floor)")
    parser.add_argument("--prompts", type=int, default=8, help="sequences of the greedy identity check")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--no-compile", action="store_true", help="Hugging Face's generate uncompiled")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke test of the script on any device)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_regime.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(path)  # atomic: never a half-written file
    print(json.dumps({k: result[k] for k in ("target_step_ms", "floor_ms", "step_over_floor", "c",
                                             "differing_rows", "greedy_identity", "hf_static_tokens_per_s")},
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
