"""End of sequence: nothing after an EOS token can be emitted, so every token list stops at the first one."""

from __future__ import annotations

from typing import Collection, Sequence


def cut_after_eos(tokens: Sequence[int], eos_token_ids: Collection[int]) -> list[int]:
    """The tokens up to and including the first EOS (all of them when there is none)."""
    for i, token in enumerate(tokens):
        if token in eos_token_ids:
            return list(tokens[: i + 1])
    return list(tokens)
