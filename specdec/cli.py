"""Command line: `python -m specdec generate --target DIR|FILE.gguf [--draft DIR|FILE.gguf] --prompt TEXT ...`.

Two regimes, told apart by the paths: prepared model directories (safetensors, fp32 or bf16) or GGUF files (each
model runs its file's own quantized tensors on the lean engine, the tokenizer comes from the target's file).
Results go to stdout (the generated text, or one JSON object with --json); progress and statistics go to stderr.
Exit codes: 0 success, 1 greedy identity violated (--baseline at temperature 0), 2 bad arguments or unusable models.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Sequence

EXIT_OK, EXIT_IDENTITY, EXIT_USAGE = 0, 1, 2
GGUF_SUFFIX = ".gguf"  # specdec.gguf.loading's; not imported here, so that --help stays fast


class UsageError(ValueError):
    """A bad argument: reported as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (no usage dump); exit code 2 as usual."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    from specdec.fp32.loading import LINEAR_KERNELS

    parser = _Parser(prog="specdec", description="Exact speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = sub.add_parser(
        "generate",
        help="generate text with speculative (or plain) decoding",
        description="Generate a continuation of one prompt. With --draft: speculative decoding (exact: at "
                    "temperature 0 the tokens equal plain greedy decoding's); without: plain decoding.",
    )
    gen.add_argument("--target", required=True, metavar="PATH",
                     help="the target: a prepared model directory (manifest.json), or a GGUF file (*.gguf: its own "
                          "quantized weights run on the lean engine, its tokenizer read from the file)")
    gen.add_argument("--draft", metavar="PATH",
                     help="the draft: a prepared model directory, or a GGUF file when the target is one (same "
                          "vocabulary as the target's); omitted: plain decoding, or --draft-layers of the target")
    gen.add_argument("--draft-layers", type=int, default=None, metavar="N",
                     help="draft with the first N layers of --draft (a truncated draft), or without --draft of the "
                          "target itself (early exit), sharing those weights in memory")
    gen.add_argument("--k", type=int, default=4, help="draft tokens proposed per target pass (default 4)")
    gen.add_argument("--prompt", required=True, help="the prompt text ('-': read it from stdin)")
    gen.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="tokens to generate (default 32)")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default 0)")
    gen.add_argument("--top-k", type=int, default=None, metavar="K")
    gen.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus mass in (0, 1]")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    gen.add_argument("--json", action="store_true", help="print one JSON object (tokens, text, statistics)")
    gen.add_argument("--no-chat-template", action="store_true",
                     help="feed the prompt as is, even if the tokenizer has a chat template")
    gen.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                     help="a model directory's dtype (default float32); not for GGUF files, which run their own types")
    gen.add_argument("--draft-dtype", choices=("float32", "bfloat16"), default=None,
                     help="the draft directory's dtype (default: --dtype); exactness does not depend on it")
    gen.add_argument("--device", default="cpu", help="torch device (default cpu; GGUF files: cpu only)")
    gen.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    gen.add_argument("--linear-kernel", choices=LINEAR_KERNELS, default=None,
                     help="model directories: how linear layers and attention run on the CPU: invariant (the "
                          "default; order-fixed native kernels: a verify pass gives the same bits as one-token "
                          "steps, so greedy identity holds by construction), auto (the backend measured fastest here "
                          "per weight shape and row count, timed at load: ~20 s for the 1.5B; not batch-invariant), "
                          "avx2, weight_major, or default (torch's nn.Linear); see docs/performance.md. GGUF files "
                          "always run the order-fixed quantized kernel")
    gen.add_argument("--baseline", action="store_true",
                     help="also run plain decoding: report the speedup and, at temperature 0, check greedy identity")
    return parser


def _validate(args: argparse.Namespace) -> None:
    if args.k < 1:
        raise UsageError(f"--k must be >= 1, got {args.k}")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.temperature >= 0.0 or math.isinf(args.temperature):  # also rejects NaN
        raise UsageError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.draft_layers is not None and args.draft_layers < 1:
        raise UsageError(f"--draft-layers must be >= 1, got {args.draft_layers}")
    if args.draft is not None and _is_gguf(args.target) != _is_gguf(args.draft):
        raise UsageError(f"--target {args.target} and --draft {args.draft}: both GGUF files (*{GGUF_SUFFIX}) or both "
                         "model directories")
    if _is_gguf(args.target):
        given = [f"--{name.replace('_', '-')}" for name in ("dtype", "draft_dtype", "linear_kernel")
                 if getattr(args, name) is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: not for GGUF files, which run their own tensor types on the "
                             "order-fixed quantized kernel")
        if args.device != "cpu":
            raise UsageError(f"GGUF files run on the CPU only, got --device {args.device}")


def _is_gguf(path: str) -> bool:
    return path.lower().endswith(GGUF_SUFFIX)


def _finite(x: float) -> float | None:
    """NaN/inf are not JSON: report them as null."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _status(msg: str) -> None:
    print(f"specdec: {msg}", file=sys.stderr, flush=True)


def _load(path: str, role: str, args: argparse.Namespace, dtype: str):
    from specdec.fp32.loading import Runtime, load_for_decoding, read_manifest

    read_manifest(path)  # a clear InvalidModelDirError for a missing or unprepared directory
    start = time.perf_counter()
    runtime = Runtime(dtype=dtype, device=args.device, linear_kernel=args.linear_kernel or "invariant")
    model, tok = load_for_decoding(path, runtime)
    _status(f"loaded {role} {path} ({dtype}) in {time.perf_counter() - start:.1f} s")
    return model, tok


def _load_gguf(path: str, role: str, max_length: int, header):
    from specdec.gguf.loading import load_gguf_for_decoding
    from specdec.fp32.loading import Runtime

    start = time.perf_counter()
    session, _ = load_gguf_for_decoding(path, Runtime(weights="gguf"), max_length=max_length)
    types = sorted({t.qtype for t in header.tensors.values() if len(t.shape) == 2})
    _status(f"loaded {role} {path} (GGUF: {', '.join(types)}; {session.config.layers} layer(s), "
            f"{session.step_bytes() / 2**20:.0f} MiB read per step) in {time.perf_counter() - start:.1f} s")
    return session


def _prompt_ids(args: argparse.Namespace, tok):
    import torch

    from specdec.chat import apply_chat_template, tokenize_prompts

    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    use_template = not args.no_chat_template and getattr(tok, "chat_template", None) is not None
    chat_text = apply_chat_template([text], tok, use_chat_template=use_template)[0]
    ids = tokenize_prompts([chat_text], tok, use_chat_template=use_template)[0]
    if not ids:
        raise UsageError("the prompt is empty after tokenisation")
    _status(f"prompt: {len(ids)} tokens{' (chat template)' if use_template else ''}")
    return torch.tensor([ids], dtype=torch.long, device=args.device)


def _load_directories(args: argparse.Namespace):
    """Prepared model directories: (target, draft or None, tokenizer, prompt ids)."""
    from specdec.drafts import EarlyExitDraft
    from specdec.fp32.loading import check_same_vocabulary, read_manifest

    # Check both directories before loading anything heavy.
    read_manifest(args.target)
    if args.draft is not None:
        read_manifest(args.draft)
    dtype = args.dtype or "float32"
    target, tok = _load(args.target, "target", args, dtype)
    draft = None
    if args.draft is not None:
        draft, draft_tok = _load(args.draft, "draft", args, args.draft_dtype or dtype)
        check_same_vocabulary(tok, draft_tok, args.target, args.draft)
    if args.draft_layers is not None:  # the first layers of the draft (or of the target), sharing its weights
        base = draft if draft is not None else target
        layers = base.config.num_hidden_layers
        if args.draft_layers > layers:
            raise UsageError(f"--draft-layers {args.draft_layers}: {args.draft or args.target} has {layers} layers")
        draft = EarlyExitDraft(base, args.draft_layers)
    return target, draft, tok, _prompt_ids(args, tok)


def _load_gguf_pair(args: argparse.Namespace):
    """GGUF files: (target session, draft session or None, the target file's tokenizer, prompt ids). Both headers
    are checked (tensor types, architecture, vocabularies) before any weights are read."""
    from specdec.gguf.loading import GGUFVocabulary, check_gguf, first_layers, load_gguf_tokenizer
    from specdec.fp32.loading import check_same_vocabulary

    headers = {args.target: check_gguf(args.target)}
    if args.draft is not None:
        headers[args.draft] = check_gguf(args.draft)
        check_same_vocabulary(GGUFVocabulary(headers[args.target]), GGUFVocabulary(headers[args.draft]), args.target,
                              args.draft)
    base = args.draft or args.target
    layers = int(headers[base].metadata.get("qwen2.block_count", 0))
    if args.draft_layers is not None and args.draft_layers > layers:
        raise UsageError(f"--draft-layers {args.draft_layers}: {base} has {layers} layers")
    start = time.perf_counter()
    tok = load_gguf_tokenizer(args.target)
    _status(f"read the tokenizer of {args.target} in {time.perf_counter() - start:.1f} s")
    input_ids = _prompt_ids(args, tok)
    # a static KV cache as long as this sequence can get; refuse one past the model's context before loading it
    max_length = input_ids.shape[1] + args.max_new_tokens + 1
    context = headers[args.target].metadata.get("qwen2.context_length")
    if context and max_length - 1 > int(context):
        raise UsageError(f"the prompt ({input_ids.shape[1]} tokens) and --max-new-tokens {args.max_new_tokens} "
                         f"exceed {args.target}'s context length of {context} tokens")
    target = _load_gguf(args.target, "target", max_length, headers[args.target])
    draft = None
    if args.draft is not None and os.path.realpath(args.draft) == os.path.realpath(args.target):
        draft = first_layers(target, target.config.layers)  # the same file: its weights once, a cache of its own
    elif args.draft is not None:
        draft = _load_gguf(args.draft, "draft", max_length, headers[args.draft])
    if args.draft_layers is not None:
        draft = first_layers(draft if draft is not None else target, args.draft_layers)
        _status(f"draft: the first {args.draft_layers} of {layers} layers of {base}")
    return target, draft, tok, input_ids


def _generate(args: argparse.Namespace) -> int:
    import torch

    from specdec.decode import generate_baseline, generate_speculative

    _validate(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if _is_gguf(args.target):
        target, draft, tok, input_ids = _load_gguf_pair(args)
    else:
        target, draft, tok, input_ids = _load_directories(args)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)

    baseline = None
    if draft is None or args.baseline:
        baseline = generate_baseline(target, input_ids, args.max_new_tokens, **sampling)
        _status(f"baseline: {len(baseline.tokens)} tokens in {baseline.total_seconds:.2f} s")
    result = baseline
    if draft is not None:
        result = generate_speculative(target, draft, input_ids, args.k, args.max_new_tokens, **sampling)
        _status(f"speculative (k={args.k}): {len(result.tokens)} tokens in {result.total_seconds:.2f} s, "
                f"acceptance {result.acceptance:.3f}, {result.tokens_per_pass:.2f} tokens/target pass")

    text = tok.decode(result.tokens, skip_special_tokens=True)
    summary = result.summary()
    out = {
        "tokens": result.tokens,
        "text": text,
        "mode": "speculative" if draft is not None else "baseline",
        "weights": "gguf" if _is_gguf(args.target) else "safetensors",
        "k": args.k if draft is not None else None,
        "prompt_tokens": int(input_ids.shape[1]),
        **{key: _finite(value) for key, value in summary.items()},
    }
    code = EXIT_OK
    if draft is not None and baseline is not None:
        out["baseline_tokens"] = baseline.tokens
        out["baseline_seconds"] = baseline.total_seconds
        out["speedup"] = _finite(baseline.total_seconds / result.total_seconds) if result.total_seconds else None
        _status(f"speedup over plain decoding: {out['speedup']:.2f}x" if out["speedup"] else "speedup: n/a")
        if args.temperature == 0.0:
            identical = result.tokens == baseline.tokens
            out["greedy_identical"] = identical
            if identical:
                _status("greedy identity: speculative tokens == plain decoding tokens")
            else:
                first = next((i for i, (a, b) in enumerate(zip(result.tokens, baseline.tokens)) if a != b),
                             min(len(result.tokens), len(baseline.tokens)))
                _status(f"greedy identity VIOLATED: tokens first differ at position {first} "
                        f"({len(result.tokens)} vs {len(baseline.tokens)} tokens)")
                code = EXIT_IDENTITY

    if args.json:
        print(json.dumps(out))
    else:
        print(text)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse errors (exit 2) and --help (exit 0)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    from specdec.errors import InvalidModelDirError

    try:
        return _generate(args)  # the only command so far
    except (ValueError, InvalidModelDirError) as e:  # bad values, unprepared dirs, vocabulary mismatch
        print(f"specdec {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # unreadable files inside a model directory
        print(f"specdec {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
