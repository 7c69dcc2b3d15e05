"""Timing several methods on the same prompts in one process, interleaved: per prompt (and repeat) every method runs
back to back, the order rotating from turn to turn, so that slow drifts of a shared machine hit all of them alike
and a speedup is a ratio of timings taken seconds apart. Used by the decode stage, peers and the draft A/B."""

from __future__ import annotations

from typing import Callable, Hashable, Sequence, TypeVar

import torch

Result = TypeVar("Result")


def batch_of_one(token_ids) -> torch.Tensor:
    """A prompt's token ids (a list or array from a prompt table) as the (1, n) long tensor the loops take."""
    return torch.tensor([[int(t) for t in token_ids]], dtype=torch.long)


def run_in_rotation(methods: Sequence[Hashable], turn: int,
                    run: Callable[[Hashable], Result]) -> dict[Hashable, Result]:
    """run(method) for every method, starting at methods[turn % len(methods)] and wrapping around; the results in
    the order they ran."""
    shift = turn % len(methods)
    return {method: run(method) for method in [*methods[shift:], *methods[:shift]]}
