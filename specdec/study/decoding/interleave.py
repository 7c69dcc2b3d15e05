"""Timing several methods on the same prompts in one process, interleaved: per prompt (and repeat) every method runs
back to back, the order rotating from turn to turn, so that slow drifts of a shared machine hit all of them alike
and a speedup is a ratio of timings taken seconds apart. The one loop behind the decode stage, peers and the A/B."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, Sequence, TypeVar

import torch

from specdec.study.progress import Progress

Result = TypeVar("Result")
WARMUP_TOKENS = 2


def batch_of_one(token_ids) -> torch.Tensor:
    """A prompt's token ids (a list or array from a prompt table) as the (1, n) long tensor the loops take."""
    return torch.tensor([[int(t) for t in token_ids]], dtype=torch.long)


def run_in_rotation(methods: Sequence[Hashable], turn: int,
                    run: Callable[[Hashable], Result]) -> dict[Hashable, Result]:
    """run(method) for every method, starting at methods[turn % len(methods)] and wrapping around; the results in
    the order they ran."""
    shift = turn % len(methods)
    return {method: run(method) for method in [*methods[shift:], *methods[:shift]]}


@dataclass
class Turn:
    index: int  # the prompt's position in the prompt table
    prompt: object  # its row (a namedtuple with prompt_id and input_ids)
    repeat: int
    results: dict  # method -> what run returned, in the order the methods ran


def run_interleaved(prompts, methods: Sequence[Hashable], run: Callable[[Hashable, torch.Tensor, int], Result],
                    max_new_tokens: int, repeats: int = 1, log: Callable[[str], None] = print,
                    n_tokens: Callable[[Result], int] = lambda result: len(result.tokens),
                    describe: Callable[[Turn], str] = lambda turn: "") -> Iterator[Turn]:
    """Warm up every method on the first prompt (first calls allocate and pick kernels: not recorded), then per
    prompt (a DataFrame with prompt_id and input_ids) and repeat run every method as run(method, input_ids,
    max_new_tokens), starting one method later each turn. Yields each turn. Progress per sequence goes to the
    `specdec.progress` logger; `log` gets one line per turn (describe(turn)), where describe gives one."""
    warm = batch_of_one(prompts.iloc[0]["input_ids"])
    for method in methods:
        run(method, warm, WARMUP_TOKENS)
    progress = Progress(len(prompts) * repeats * len(methods), "sequences")
    try:
        for index, prompt in enumerate(prompts.itertuples(index=False)):
            input_ids = batch_of_one(prompt.input_ids)
            for repeat in range(repeats):
                def timed(method):
                    result = run(method, input_ids, max_new_tokens)
                    label = "baseline" if method is None else f"k{method}" if isinstance(method, int) else method
                    progress.update(tokens=n_tokens(result), note=f"{prompt.prompt_id} r{repeat} {label}")
                    return result

                turn = Turn(index, prompt, repeat, run_in_rotation(methods, index + repeat, timed))
                note = describe(turn)
                if note:
                    log(f"[{index + 1}/{len(prompts)} prompts r{repeat}] {prompt.prompt_id}: {note}")
                yield turn
    finally:
        progress.close()
