"""The feature heads' corpus (specdec/study/training/head_corpus.py): files of a pinned wheel cut at line boundaries,
each chunk after a request in the chat template, no chunk sharing a line with an evaluation prompt, the wheel's RECORD
checked."""

from __future__ import annotations

import pytest

from specdec.study.training.head_corpus import CorpusPart, corpus_table, line_chunks, shared_lines
from tests.test_prompts import CHAT_TEMPLATE, make_wheel


@pytest.fixture(scope="module")
def tokenizer():
    """One token per byte (byte-level, no merges), and the chat template's markers as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def test_line_chunks_keep_the_lines_in_order_within_the_budget():
    lines = ["a" * n + "\n" for n in (3, 4, 2, 9, 30, 1, 5)]
    counts = [len(line) for line in lines]
    chunks = line_chunks("".join(lines), counts, budget=12, min_tokens=4)
    # greedy in order: [3+4+2=9 ... +9 > 12] -> 'aaa aaaa aa', 'a'*9 + '\n' (10), the 31-character line alone
    # (over the budget: dropped), 'a' + 'aaaaa' (8)
    assert chunks == [lines[0] + lines[1] + lines[2], lines[3], lines[5] + lines[6]]
    assert line_chunks("".join(lines), counts, budget=12, min_tokens=9) == [chunks[0], chunks[1]]


def test_the_corpus_is_chunks_after_a_request_and_none_shares_a_line_with_an_evaluation_prompt(tmp_path,
                                                                                             tokenizer):
    evaluation_prompt = "def secret_function(values):\n    return sorted(values)[::-1]  # the evaluation's own\n"
    files = {f"pkg/m{i}.py": "".join(f"x_{i}_{j} = {j} * {i}  # line {j} of file {i}\n" for j in range(12)).encode()
             for i in range(3)}
    files["pkg/leaky.py"] = ("import os\n" + evaluation_prompt + "print('done')\n").encode()
    files["pkg/README.md"] = b"# Title\n\nSome words of documentation.\n"
    wheel = make_wheel(tmp_path, "pkg", "1.0", files)
    banned = shared_lines([evaluation_prompt])
    assert banned == {"return sorted(values)[::-1]  # the evaluation's own"}  # 'def secret_function(values):' < 30
    parts = [CorpusPart("code", "pkg/*.py", "Write part {chunk} of {path}.", sequences=4)]
    lines = []
    table = corpus_table(parts, {"code": wheel}, tokenizer, tokens=120, banned=banned, seed=0, log=lines.append)
    assert len(table) == 4 and "1 dropped sharing a line" in lines[0]
    assert not table["member"].eq("pkg/leaky.py").any()
    for row in table.itertuples():
        text = tokenizer.decode(row.input_ids)
        request = f"<|user|>\nWrite part {row.chunk} of {row.member}.<|end|>\n<|assistant|>\n"
        assert text.startswith(request) and tokenizer.decode(row.input_ids[:row.n_prompt]) == request
        assert text[len(request):] in files[row.member].decode()  # whole lines of the file, as written
        assert row.prompt_id == f"code:{row.member}#{row.chunk}"
    # seeded: the same picks again, other picks under another seed
    again = corpus_table(parts, {"code": wheel}, tokenizer, tokens=120, banned=banned, seed=0, log=lambda _: None)
    assert again["prompt_id"].tolist() == table["prompt_id"].tolist()
    other = corpus_table(parts, {"code": wheel}, tokenizer, tokens=120, banned=banned, seed=1, log=lambda _: None)
    assert other["prompt_id"].tolist() != table["prompt_id"].tolist()
    # three files of 12 lines of ~36 bytes: 4 chunks of 3 lines each; the leaky file's one chunk is dropped
    with pytest.raises(ValueError, match="corpus part 'code': 12 chunks of 'pkg/\\*.py', 13 asked"):
        corpus_table([CorpusPart("code", "pkg/*.py", "{path}", 13)], {"code": wheel}, tokenizer, 120, banned, 0,
                     log=lambda _: None)


def test_a_member_that_does_not_match_the_wheels_record_is_refused(tmp_path, tokenizer):
    wheel = make_wheel(tmp_path, "pkg", "1.0", {"pkg/a.py": b"a = 1\n" * 20}, corrupt=True)
    with pytest.raises(ValueError, match="pkg/a.py does not match the hash in the wheel's RECORD"):
        corpus_table([CorpusPart("c", "pkg/*.py", "{path}", 1)], {"c": wheel}, tokenizer, 40, frozenset(), 0)
    with pytest.raises(FileNotFoundError, match="no text member of pkg-1.0-py3-none-any.whl matches"):
        corpus_table([CorpusPart("c", "pkg/*.md", "{path}", 1)], {"c": wheel}, tokenizer, 40, frozenset(), 0)
