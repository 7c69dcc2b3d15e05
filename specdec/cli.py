"""Command line: `python -m specdec generate --target DIR|FILE.gguf [--draft-kind KIND] [--draft PATH] --prompt TEXT`.

Two regimes, told apart by the paths: prepared model directories (safetensors, fp32 or bf16) or GGUF files (each
model runs its file's own quantized tensors on the lean engine, the tokenizer comes from the target's file). The
draft is any kind of the registry (specdec.drafts), its fields given as options or a small YAML file, checked by the
registry and built by the front door for loading (specdec.load) as the study builds it. docs/cli.md has the
reference. Results go to stdout (the generated text, or one JSON object with --json); progress and statistics go to
stderr. Exit codes: 0 success, 1 greedy identity violated (--baseline at temperature 0), 2 bad arguments, drafts or
unusable models (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

EXIT_OK, EXIT_IDENTITY, EXIT_USAGE = 0, 1, 2
DRAFT_KEY = "draft"  # what the registry's errors name a draft's fields by: 'draft.kind', 'draft.ngram_max'
MODEL_FIELD = "model"  # a kind's field naming the model it loads: here the --draft path


class UsageError(ValueError):
    """A bad argument: reported as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (no usage dump); exit code 2 as usual."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _kinds_epilog() -> str:
    """Every registered draft kind with what its --draft is and its fields: read from the registry (which imports
    neither torch nor transformers, so --help stays fast)."""
    import textwrap

    from specdec.drafts import get_kind, kind_names

    lines = ["draft kinds (--draft-kind; fields as --draft-option KEY=VALUE or in --draft-spec; * required):"]
    for name in kind_names():
        kind = get_kind(name)
        fields = [f"{field}{'*' if field in kind.required else ''}" for field in kind.fields if field != MODEL_FIELD]
        lines += textwrap.wrap(f"{name}: {kind.description}", 100, initial_indent="  ", subsequent_indent="      ",
                               break_on_hyphens=False)
        lines += textwrap.wrap(f"{_draft_path(kind)}; fields: {', '.join(fields) or 'none'}", 100,
                               initial_indent="      ", subsequent_indent="      ", break_on_hyphens=False)
    return "\n".join(lines)


def _draft_path(kind) -> str:
    """What --draft is for a kind (its `model` field, where it has one)."""
    if kind.model is None:
        return "no --draft"
    if kind.load is not None:
        return f"--draft: a directory of its own kind (made by {kind.made_by})"
    if kind.model == "own" and not kind.gguf_cut:
        return f"--draft: a prepared model directory (made by {kind.made_by})"
    return "--draft: a model directory, or a GGUF file"


def _build_parser() -> argparse.ArgumentParser:
    from specdec.runtime import LINEAR_KERNELS  # the settings alone: no torch at --help

    parser = _Parser(prog="specdec", description="Exact speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = sub.add_parser(
        "generate",
        help="generate text with speculative (or plain) decoding",
        description="Generate a continuation of one prompt. With a draft: speculative decoding (exact: at "
                    "temperature 0 the tokens equal plain greedy decoding's); without: plain decoding.",
        epilog=_kinds_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("--target", required=True, metavar="PATH",
                     help="the target: a prepared model directory (manifest.json), or a GGUF file (*.gguf: its own "
                          "quantized weights run on the lean engine, its tokenizer read from the file)")
    gen.add_argument("--draft", metavar="PATH",
                     help="the draft's model: a prepared model directory, or a GGUF file when the target is one (same "
                          "vocabulary as the target's); for a kind with a model of its own (feature_head) its "
                          "directory; omitted: plain decoding, a kind without a model, or --draft-layers of the target")
    gen.add_argument("--draft-kind", metavar="KIND",
                     help="the draft's kind, one of the registry's (listed below); default: model with --draft, "
                          "truncated with --draft and --draft-layers, early_exit with --draft-layers alone")
    gen.add_argument("--draft-option", action="append", default=[], metavar="KEY=VALUE",
                     help="a field of the draft's kind (repeatable); VALUE is read as YAML: 3, 0.5, true, q8_0")
    gen.add_argument("--draft-spec", metavar="FILE",
                     help="the draft's kind and fields as a YAML mapping, e.g. {kind: hybrid, ngram_max: 3}; "
                          "--draft-kind, --draft-option, --draft-layers and --draft-dtype override its entries")
    gen.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                     help="import a module that registers draft kinds of its own (repeatable)")
    gen.add_argument("--draft-layers", type=int, default=None, metavar="N",
                     help="the draft field layers: draft with the first N layers of --draft (a truncated draft), or "
                          "without --draft of the target itself (early exit), sharing those weights in memory")
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
                     help="the draft field dtype: the draft directory's dtype (default: --dtype); exactness does not "
                          "depend on it")
    gen.add_argument("--device", default="cpu", help="torch device (default cpu; GGUF files: cpu only)")
    gen.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    gen.add_argument("--linear-kernel", choices=LINEAR_KERNELS, default=None,
                     help="model directories: how linear layers and attention run on the CPU: invariant (the "
                          "default; order-fixed native kernels: a verify pass gives the same bits as one-token "
                          "steps, so greedy identity holds by construction), auto (the backend measured fastest here "
                          "per weight shape and row count, timed at load: ~20 s for the 1.5B; not batch-invariant), "
                          "avx2, weight_major, or default (torch's nn.Linear); see docs/performance.md. GGUF files "
                          "always run the order-fixed quantized kernel")
    gen.add_argument("--session", choices=("cached", "fixed"), default=None,
                     help="model directories: cached (the default; a growing KV cache) or fixed (every pass padded "
                          "to --session-rows rows over a static cache: a step and any verify pass the same bits with "
                          "torch's own kernels, CUDA graphs on cuda; needs --linear-kernel default on the CPU)")
    gen.add_argument("--session-rows", type=int, default=None, metavar="R",
                     help="rows of every fixed-shape pass (default 16)")
    gen.add_argument("--argmax-head", action=argparse.BooleanOptionalAction, default=None,
                     help="GGUF targets at temperature 0: greedy steps and verify passes read the top four bits of "
                          "the Q6_K LM head, then only the rows that can be the argmax (the same tokens, 30%% fewer "
                          "head bytes a step; about a second at load to build). Default: on where it applies (a "
                          "GGUF target with a Q6_K head, --temperature 0)")
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
    if _is_gguf(args.target):
        given = [f"--{name.replace('_', '-')}" for name in ("dtype", "draft_dtype", "linear_kernel", "session",
                                                             "session_rows")
                 if getattr(args, name) is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: not for GGUF files, which run their own tensor types on the "
                             "order-fixed quantized kernel")
        if args.device != "cpu":
            raise UsageError(f"GGUF files run on the CPU only, got --device {args.device}")
    if args.argmax_head and not _is_gguf(args.target):  # asked for by name (None: the default, below)
        raise UsageError("--argmax-head reads a GGUF file's Q6_K LM head: the target must be a .gguf file")
    if args.argmax_head and args.temperature != 0:
        raise UsageError(f"--argmax-head computes only the argmax: it is for greedy decoding (--temperature 0), "
                         f"got --temperature {args.temperature}")


def _is_gguf(path: str) -> bool:
    from specdec.load import weights_of

    return weights_of(path) == "gguf"


def _draft_spec(args: argparse.Namespace) -> dict | None:
    """The draft's spec ({kind, ...fields}) the options ask for, checked whole by the registry (its own errors,
    naming 'draft.<field>'), or None for plain decoding. Its `model` field, where the kind has one, is --draft."""
    from specdec.drafts import check_spec, get_kind, load_plugins

    load_plugins(args.plugin)
    fields = _spec_file(args.draft_spec) if args.draft_spec else {}
    fields.update(_option(text) for text in args.draft_option)
    for name, value in (("layers", args.draft_layers), ("dtype", args.draft_dtype)):
        if value is not None:
            fields[name] = value
    kind_name = args.draft_kind or fields.pop("kind", None) or _default_kind(args.draft, "layers" in fields)
    fields.pop("kind", None)
    if kind_name is None:
        if fields:
            raise UsageError(f"draft fields {sorted(fields)} but no draft: give --draft-kind, --draft or "
                             "--draft-layers")
        return None
    kind = get_kind(kind_name, f"{DRAFT_KEY}.kind")
    if MODEL_FIELD in kind.fields and MODEL_FIELD in fields:
        raise UsageError(f"the draft field {MODEL_FIELD!r} is --draft PATH here, got {fields[MODEL_FIELD]!r}: drop "
                         "the field")
    if kind.model is None and args.draft is not None:
        raise UsageError(f"a {kind_name!r} draft loads no model: drop --draft {args.draft}")
    if kind.model is not None and args.draft is None:
        raise UsageError(f"a {kind_name!r} draft loads a model: give it with --draft PATH")
    spec = {"kind": kind_name, **({MODEL_FIELD: args.draft} if MODEL_FIELD in kind.fields else {}), **fields}
    check_spec(spec, DRAFT_KEY)
    return spec


def _default_kind(draft: str | None, layers: bool) -> str | None:
    """Today's options without --draft-kind: a draft model (its first layers: truncated), the target's own first
    layers (early exit), or no draft."""
    if draft is not None:
        return "truncated" if layers else "model"
    return "early_exit" if layers else None


def _spec_file(path: str) -> dict:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"--draft-spec {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise UsageError(f"--draft-spec {path}: not YAML ({' '.join(str(e).split())})") from e
    if not isinstance(data, dict):
        raise UsageError(f"--draft-spec {path}: a YAML mapping of the draft's kind and fields, got {data!r}")
    return dict(data)


def _option(text: str) -> tuple[str, object]:
    import yaml

    key, equals, value = text.partition("=")
    key = key.strip()
    if not equals or not key:
        raise UsageError(f"--draft-option {text!r}: KEY=VALUE")
    if key == "kind":
        raise UsageError(f"--draft-option {text!r}: give the kind with --draft-kind")
    try:
        return key, yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise UsageError(f"--draft-option {text!r}: the value is not YAML ({' '.join(str(e).split())})") from e


def _model_file(args: argparse.Namespace, spec: dict | None) -> str | None:
    """--draft where it is a model of the target's regime (a directory or a GGUF file), checked against the
    target's; None for no draft, a kind without a model, or a directory of the kind's own (a feature head)."""
    from specdec.drafts import get_kind

    kind = get_kind(spec["kind"]) if spec is not None else None
    if kind is None or kind.model is None or kind.load is not None:
        return None
    if _is_gguf(args.target) != _is_gguf(args.draft):
        raise UsageError(f"--target {args.target} and --draft {args.draft}: both GGUF files (*.gguf) or both "
                         "model directories")
    return args.draft


def _check_pair(args: argparse.Namespace, spec: dict | None):
    """Both paths checked, their vocabularies compared and a draft's layers against its model's, before anything
    loads; returns the target's ModelInfo."""
    from specdec.load import check_model, check_same_vocabularies

    target = check_model(args.target)
    draft_path = _model_file(args, spec)
    draft = check_model(draft_path) if draft_path else None
    if draft is not None:
        check_same_vocabularies(target, draft)
    base = draft or target  # the model a draft's first layers are cut from
    layers = (spec or {}).get("layers")
    if layers is not None and base.layers and layers > base.layers:
        given = f"--draft-layers {layers}" if args.draft_layers is not None else f"draft field layers {layers}"
        raise UsageError(f"{given}: {base.path} has {base.layers} layers")
    return target


def _argmax_head(args: argparse.Namespace, info) -> bool:
    """Whether the GGUF target runs the exact argmax head: as asked, or by default where it applies (greedy decoding
    and a Q6_K head: the file's output.weight, else its tied token embedding)."""
    if args.argmax_head is not None:
        return args.argmax_head
    tensors = info.header.tensors
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    on = args.temperature == 0 and head is not None and head.qtype == "Q6_K"
    if on:
        _status("the exact argmax head: on (greedy decoding, a Q6_K head; --no-argmax-head turns it off)")
    return on


def _describe(spec: dict) -> str:
    fields = ", ".join(f"{key}={value}" for key, value in spec.items() if key != "kind")
    return f"{spec['kind']} ({fields})" if fields else spec["kind"]


def _make_draft(args: argparse.Namespace, spec: dict | None, target, tokenizer, runtime):
    """The draft's proposer as the study builds it (specdec.load.make_draft), or None for plain decoding."""
    from specdec.load import make_draft

    if spec is None:
        return None
    start = time.perf_counter()
    draft = make_draft(args.draft or spec["kind"], spec, target, tokenizer, args.draft, runtime)
    _status(f"loaded draft {_describe(spec)} in {time.perf_counter() - start:.1f} s")
    return draft


def _finite(x: float) -> float | None:
    """NaN/inf are not JSON: report them as null."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _status(msg: str) -> None:
    print(f"specdec: {msg}", file=sys.stderr, flush=True)


def _load_target(args: argparse.Namespace, runtime, info, max_length: int | None = None):
    """The target as the study loads it (specdec.load.load_target), with a line on stderr about it (info: its
    ModelInfo)."""
    from specdec.load import load_target

    start = time.perf_counter()
    model, tokenizer = load_target(args.target, runtime, max_length=max_length)
    seconds = time.perf_counter() - start
    if info.header is None:
        _status(f"loaded target {args.target} ({runtime.dtype}) in {seconds:.1f} s")
    else:
        types = sorted({t.qtype for t in info.header.tensors.values() if len(t.shape) == 2})
        _status(f"loaded target {args.target} (GGUF: {', '.join(types)}; {model.config.layers} layer(s), "
                f"{model.step_bytes() / 2**20:.0f} MiB read per step) in {seconds:.1f} s")
    return model, tokenizer


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


def _load_directories(args: argparse.Namespace, spec: dict | None):
    """Prepared model directories: (target, draft or None, tokenizer, prompt ids)."""
    from specdec.runtime import Runtime

    target_info = _check_pair(args, spec)
    try:
        runtime = Runtime(dtype=args.dtype or "float32", device=args.device,
                          linear_kernel=args.linear_kernel or "invariant", session=args.session or "cached",
                          session_rows=16 if args.session_rows is None else args.session_rows)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if runtime.session == "fixed":  # a static cache as long as this sequence can get: the prompt first
        from specdec.load import load_tokenizer

        input_ids = _prompt_ids(args, load_tokenizer(args.target))
        target, tok = _load_target(args, runtime, target_info, input_ids.shape[1] + args.max_new_tokens + 1)
    else:
        target, tok = _load_target(args, runtime, target_info)
        input_ids = _prompt_ids(args, tok)
    return target, _make_draft(args, spec, target, tok, runtime), tok, input_ids


def _load_gguf_pair(args: argparse.Namespace, spec: dict | None):
    """GGUF files: (target session, draft or None, the target file's tokenizer, prompt ids). Both headers are
    checked (tensor types, architecture, vocabularies) and the draft's kind asked whether it runs here before any
    weights are read."""
    from specdec.drafts.registry import gguf_draft_source
    from specdec.load import load_tokenizer
    from specdec.runtime import Runtime

    target_info = _check_pair(args, spec)
    if spec is not None:
        gguf_draft_source(args.draft or spec["kind"], spec)  # a kind with weights of its own, or a dtype: refused
    start = time.perf_counter()
    tok = load_tokenizer(args.target)
    _status(f"read the tokenizer of {args.target} in {time.perf_counter() - start:.1f} s")
    input_ids = _prompt_ids(args, tok)
    # a static KV cache as long as this sequence can get; refuse one past the model's context before loading it
    max_length = input_ids.shape[1] + args.max_new_tokens + 1
    if target_info.context and max_length - 1 > target_info.context:
        raise UsageError(f"the prompt ({input_ids.shape[1]} tokens) and --max-new-tokens {args.max_new_tokens} "
                         f"exceed {args.target}'s context length of {target_info.context} tokens")
    runtime = Runtime(weights="gguf", argmax_head=_argmax_head(args, target_info))
    target, vocabulary = _load_target(args, runtime, target_info, max_length)
    return target, _make_draft(args, spec, target, vocabulary, runtime), tok, input_ids


def _generate(args: argparse.Namespace) -> int:
    _validate(args)
    spec = _draft_spec(args)  # refused by the registry before torch or any model loads
    import torch

    from specdec.decode import generate_baseline, generate_speculative

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if _is_gguf(args.target):
        target, draft, tok, input_ids = _load_gguf_pair(args, spec)
    else:
        target, draft, tok, input_ids = _load_directories(args, spec)
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
        "draft": spec,
        "weights": "gguf" if _is_gguf(args.target) else "safetensors",
        "session": getattr(target, "describe", lambda: {"kind": type(target).__name__})(),  # what ran the target
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
