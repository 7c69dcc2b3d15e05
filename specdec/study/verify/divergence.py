"""Where two decodings of the same prompt part ways: the one comparison of token sequences that the study's greedy
check (diagnose.py) and the llama.cpp stage both use. No torch here: the Snakefile imports the llama.cpp stage."""

from __future__ import annotations

from collections.abc import Sequence


def first_difference(a: Sequence, b: Sequence, n: int | None = None) -> int | None:
    """The first position where two token sequences differ within their first n tokens (all when n is None).

    - a position where both have a token and the tokens differ: that position;
    - one is a strict prefix of the other (e.g. one stopped at EOS earlier): the shorter length, the first position
      where one has a token and the other has none;
    - equal (within the first n): None, there is no difference.
    """
    a, b = list(a)[:n], list(b)[:n]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
