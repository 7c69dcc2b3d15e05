"""Text the target reads for the feature heads' training, beside its own answers: the source files and documentation
pages of pinned PyPI archives (the evaluation suites the training prompts come from), cut into chunks at line
boundaries, each put after a one-line request as the assistant's reply in the chat template.

Reading costs one forward over every position (~5 ms a position on the GGUF engine on 2 cores) where an answer
costs a full step per generated token (~20 ms): the same budget buys several times the positions. The tokens are not
the target's own choice, but every position still carries the target's features and its own distribution there,
which is what the head learns (EAGLE trained on fixed conversations, not on the target's answers).

A chunk is dropped when one of its lines (stripped, at least `MIN_SHARED_LINE` characters) is a line of an
evaluation source's prompts: a suite that ships HumanEval or MT-Bench must not leak them into training.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from specdec.chat import apply_chat_template
from specdec.study.prepare import wheels as pypi

MIN_SHARED_LINE = 30  # characters: shorter lines ("return result", "```python") are shared by chance
CORPUS_COLUMNS = ["prompt_id", "part", "member", "chunk", "n_prompt", "input_ids"]


@dataclass(frozen=True)
class CorpusPart:
    """One part of the corpus: the members of an archive matching `file_glob`, `sequences` chunks of them picked."""
    name: str
    file_glob: str
    instruction: str  # the user's request; may name {path} and {chunk}
    sequences: int


def archive_texts(archive: str | Path, file_glob: str) -> list[tuple[str, str]]:
    """(member, text) of every member of a wheel matching the glob, sorted by name, each checked against the hash
    in the wheel's RECORD (read as data, never imported); members that are not UTF-8 text are skipped."""
    from specdec.study.prepare.prompts import _glob_regex

    archive = Path(archive)
    rx = _glob_regex(file_glob)
    out = []
    with zipfile.ZipFile(archive) as zf:
        record = pypi.record_hashes(zf)
        for name in sorted(n for n in zf.namelist() if rx.match(n) and not n.endswith("/")):
            data = pypi.checked_member(zf, name, record, archive.name)
            try:
                out.append((name, data.decode("utf-8")))
            except UnicodeDecodeError:
                continue
    if not out:
        raise FileNotFoundError(f"no text member of {archive.name} matches {file_glob!r}")
    return out


def line_chunks(text: str, line_tokens: Sequence[int], budget: int, min_tokens: int) -> list[str]:
    """The text's lines grouped in order into chunks of at most `budget` tokens (by the lines' own counts), chunks
    under `min_tokens` dropped, and so is a line longer than the budget (data written on one line, not text)."""
    lines = text.splitlines(keepends=True)
    chunks, current, size = [], [], 0
    for line, n in zip(lines, line_tokens):
        if current and size + n > budget:
            chunks.append(("".join(current), size))
            current, size = [], 0
        current.append(line)
        size += n
    if current:
        chunks.append(("".join(current), size))
    return [c for c, n in chunks if min_tokens <= n <= budget and c.strip()]


def shared_lines(texts: Iterable[str]) -> frozenset[str]:
    """The stripped lines of at least MIN_SHARED_LINE characters of the texts: what a chunk must not contain."""
    return frozenset(s for t in texts for s in (line.strip() for line in t.splitlines()) if len(s) >= MIN_SHARED_LINE)


def overlaps(chunk: str, banned: frozenset[str]) -> bool:
    return any(line.strip() in banned for line in chunk.splitlines())


def corpus_table(parts: Sequence[CorpusPart], archives: Mapping[str, str | Path], tokenizer, tokens: int,
                 banned: frozenset[str], seed: int, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Per part, `sequences` chunks of about `tokens` tokens picked at random (seeded) among its archive's chunks
    that share no line with `banned`, each after its request in the chat template: prompt_id, part, member, chunk
    (its index in the member), n_prompt (the template's and request's tokens), input_ids."""
    rows = []
    for part in parts:
        candidates = []
        dropped = 0
        for member, text in archive_texts(archives[part.name], part.file_glob):
            counts = [len(ids) for ids in tokenizer(text.splitlines(keepends=True) or [""],
                                                    add_special_tokens=False)["input_ids"]]
            for i, chunk in enumerate(line_chunks(text, counts, tokens, min_tokens=tokens // 4)):
                if overlaps(chunk, banned):
                    dropped += 1
                else:
                    candidates.append((member, i, chunk))
        if len(candidates) < part.sequences:
            raise ValueError(f"corpus part {part.name!r}: {len(candidates)} chunks of {part.file_glob!r}, "
                             f"{part.sequences} asked")
        rng = np.random.default_rng([seed, len(rows)])
        picked = sorted(rng.choice(len(candidates), size=part.sequences, replace=False))
        log(f"corpus part {part.name}: {len(candidates)} chunks ({dropped} dropped sharing a line with an "
            f"evaluation prompt), {part.sequences} picked")
        for j in picked:
            member, i, chunk = candidates[j]
            request = part.instruction.format(path=member, chunk=i + 1)
            head = apply_chat_template([request], tokenizer)[0]
            prompt_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
            ids = prompt_ids + tokenizer(chunk, add_special_tokens=False)["input_ids"]
            rows.append({"prompt_id": f"{part.name}:{member}#{i + 1}", "part": part.name, "member": member,
                         "chunk": i + 1, "n_prompt": len(prompt_ids), "input_ids": [int(t) for t in ids]})
    return pd.DataFrame(rows, columns=CORPUS_COLUMNS)
