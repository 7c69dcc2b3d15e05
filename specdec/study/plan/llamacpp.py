"""The llamacpp stage (workflow/rules/llamacpp.smk, docs/llamacpp.md): llama.cpp built from the pinned sdist, run on
the study's GGUF files and prompts; and the side-by-side job (vs_llamacpp), our engine in the gguf regime next to
llama.cpp on the same files. Neither is part of the default DAG."""

from __future__ import annotations

import glob
from functools import cached_property

from specdec.study.peers import llamacpp

from .drafts import DraftPlan
from .run import PlanError, gguf_file, model_dir


class LlamacppPlan(DraftPlan):
    @cached_property
    def llamacpp(self) -> dict:
        """config.llamacpp over its defaults."""
        return llamacpp.settings(self.config)

    @property
    def llamacpp_build(self) -> dict:
        """What the build job reads of config.llamacpp (its params: the rest does not build it again)."""
        return llamacpp.build_settings(self.llamacpp)

    @property
    def llamacpp_dir(self) -> str:
        """The build: resources/llamacpp/<version>/{bin/,manifest.json}."""
        return f"resources/llamacpp/{self.llamacpp['version']}"

    @property
    def llamacpp_sdist(self) -> str:
        package = self.llamacpp["package"]
        return f"resources/downloads/{package}/{llamacpp.sdist_name(package, self.llamacpp['version'])}"

    def llamacpp_exported_kinds(self) -> list[str]:
        """Drafts with a model directory of their own (truncated, distilled: made from a model's first layers),
        exported to GGUF from their safetensors."""
        return [name for name in self.section("draft_kinds")
                if self.draft_kind(name).model == "own" and self.draft_kind(name).load is None]

    def llamacpp_drafts(self) -> list[str]:
        """The drafts llama.cpp runs: llamacpp.drafts, else the study's drafts that are GGUF models."""
        if self.llamacpp["drafts"] is not None:
            return list(self.llamacpp["drafts"])
        return [d for d in self.config["drafts"] if d in self.gguf_models()]

    def llamacpp_k(self) -> list[int]:
        return list(self.llamacpp["k"] or self.decoding["k"])

    def llamacpp_gguf_inputs(self) -> dict:
        """name -> GGUF file of the target and every llama.cpp draft."""
        return {name: gguf_file(name) for name in dict.fromkeys([self.config["target"], *self.llamacpp_drafts()])}

    def llamacpp_export_inputs(self, exported: str) -> dict:
        """An exported draft's safetensors and the GGUF file of the model it was cut from (its metadata)."""
        return {"model": model_dir(exported), "base": gguf_file(self.draft_spec(exported)["model"])}

    def llamacpp_run_files(self) -> list[str]:
        return [f"{self.paths.results}/llamacpp/runs/{d}/{dom}.parquet" for d in self.llamacpp_drafts()
                for dom in self.domains]

    def llamacpp_engine_files(self) -> list[str]:
        """Greedy decode runs of our engine, the study's and the draft sweep's, where they exist (tokens/s for
        scale): read if present, never scheduled by the llamacpp stage."""
        results = self.paths.results
        return sorted(glob.glob(f"{results}/runs/greedy/*/*/k*/seed0/sequences.parquet")
                      + glob.glob(f"{results}/sweep/runs/greedy/*/*/k*/seed0/sequences.parquet"))

    # --- our engine and llama.cpp side by side ----------------------------------------------------------------
    @cached_property
    def vs_llamacpp(self) -> dict:
        """config.vs_llamacpp over its defaults: our drafts (name -> k) and llama.cpp's draft."""
        return llamacpp.side_by_side_settings(self.config)

    def vs_llamacpp_prompts(self, domain: str) -> int | None:
        """How many of the domain's prompts the side-by-side job runs (prompts_per_domain: a number for every
        domain, or per domain with `default` for the rest; null: every prompt)."""
        per = self.vs_llamacpp["prompts_per_domain"]
        return per.get(domain, per.get("default")) if isinstance(per, dict) else per

    def vs_llamacpp_gguf_files(self) -> dict:
        """name -> GGUF file of the target, our drafts' models and llama.cpp's draft."""
        names = [self.config["target"], self.vs_llamacpp["llamacpp"]["draft"],
                 *map(self.draft_gguf_model, self.vs_llamacpp["drafts"])]
        return {name: gguf_file(name) for name in dict.fromkeys(n for n in names if n)}

    def vs_llamacpp_inputs(self) -> dict:
        """The side-by-side job's weights: the target's file, llama.cpp's draft's, our drafts' files, and the
        directory of a draft whose model is of its own kind (a feature head, named after the draft). Refused
        outside the gguf regime."""
        if not self.gguf:
            raise PlanError("vs_llamacpp runs our engine on the GGUF files: run it with runtime.weights 'gguf' "
                            "(--configfile config/gguf.yaml)")
        files, target = self.vs_llamacpp_gguf_files(), self.config["target"]
        own = {f"own_{name}": model_dir(self.draft_model_name(name)) for name in self.vs_llamacpp["drafts"]
               if self.draft_kind(name).load is not None}
        llama_draft = self.vs_llamacpp["llamacpp"]["draft"]  # None: llama.cpp runs plain only
        return {"target": files[target], **({"llamacpp_draft": files[llama_draft]} if llama_draft else {}),
                **{f"draft_{name}": files[name] for name in files if name != target}, **own}
