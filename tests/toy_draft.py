"""A test plugin (config key `plugins`): the toy draft kind `repeat_last`, "propose the last token again". The shared
checks of tests/test_registry.py run on it (that module imports this one), and the tiny study of
tests/test_workflow.py decodes with it through the config's `plugins`, with tests/ on PYTHONPATH: a kind defined
outside specdec goes through the registry, the whole DAG and its tables."""

from __future__ import annotations

import torch

from specdec.drafts import Proposal, register
from specdec.drafts.registry import DraftKind

KIND = "repeat_last"


class RepeatLastDraft:
    """Proposes the context's last token again (`times` times at most). Its q is a point mass on that token."""

    def __init__(self, vocab_size: int, times: int = 1):
        self.vocab_size, self.times = vocab_size, times

    def prefill(self, prompt):
        return 0.0

    def propose(self, context, k, sampling, generator):
        tokens = [context[-1]] * min(k, self.times)
        q = None if sampling.greedy else torch.nn.functional.one_hot(torch.tensor(tokens), self.vocab_size).double()
        return Proposal(tokens=tokens, q=q)

    def rollback(self, valid_length):
        pass


register(DraftKind(KIND, lambda spec, resources: RepeatLastDraft(resources.vocab_size, spec.get("times", 1)),
                   fields={"times": {"type": "integer", "minimum": 1}},
                   description="toy: the last token again"))
