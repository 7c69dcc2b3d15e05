"""The prompt-source files each prompt set reads (the evaluation's domains, a training set's) and the evaluation's
selection, which training sets recompute to leave it out."""

from __future__ import annotations

from typing import Mapping

from specdec.study.prepare.prompts import domain_source_sets, source_file_name

from .run import PlanBase, gguf_tokenizer_dir, model_dir


class PromptPlan(PlanBase):
    def prompt_source_file(self, name: str) -> str:
        """The extracted file of prompt-source set `name` (its fetch rule's output)."""
        return f"resources/prompt_sources/{source_file_name(name, self.config['prompt_sources'][name])}"

    def prompt_source_files(self, domains: Mapping) -> dict:
        """The extracted prompt-source files the given domains read, by set name."""
        return {s: self.prompt_source_file(s) for spec in domains.values() for s in domain_source_sets(spec)}

    def prompt_sources_of(self, domains: Mapping) -> dict:
        """The source specs the given domains read (a job's params: a new set elsewhere in the config reruns
        nothing)."""
        sources = self.config["prompt_sources"]
        return {s: sources[s] for spec in domains.values() for s in domain_source_sets(spec)}

    def training_prompt_inputs(self, domains: Mapping) -> dict:
        """A training prompt set's sources: its own and the evaluation's (whose selection it excludes)."""
        return self.prompt_source_files(domains) | self.prompt_source_files(self.config["domains"])

    def training_prompt_sources(self, domains: Mapping) -> dict:
        """The specs of those sources (the job's params)."""
        return self.prompt_sources_of(domains) | self.prompt_sources_of(self.config["domains"])

    def evaluation_selection(self) -> dict:
        """The evaluation's prompt selection, which training prompt sets recompute to exclude it
        (make_training_prompts.py)."""
        prompts = self.config["prompts"]
        return {"domains": self.config["domains"], "per_domain": prompts["per_domain"], "seed": prompts["seed"]}

    def prompt_inputs(self, domain: str) -> dict:
        """A domain's prompt set: its sources' files and the target's tokenizer (in the gguf regime, the one saved
        from its GGUF file)."""
        target = self.config["target"]
        tokenizer = gguf_tokenizer_dir(target) if self.gguf else model_dir(target)
        return self.prompt_source_files({domain: self.config["domains"][domain]}) | {"tokenizer": tokenizer}
