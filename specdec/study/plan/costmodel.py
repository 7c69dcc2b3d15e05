"""The cost model's files: the per-layer profiles of the models the drafts run (and of the feature heads' draft
steps), the machine's kernel tables, and the fit every machine measured so far keeps under machines_dir."""

from __future__ import annotations

import glob
from pathlib import Path

from specdec.drafts.registry import gguf_draft_source
from specdec.study.cost.prediction import head_profile_name, head_step

from .decoding import DecodingPlan
from .run import PlanError, gguf_file, model_dir

# The linear kernels whose jobs read the machine's timings: per row count ("auto") or for a bf16 prompt pass
# ("invariant").
TIMED_KERNELS = ("auto", "invariant")


class CostModelPlan(DecodingPlan):
    # --- profiles ---------------------------------------------------------------------------------------------
    def profiled_models(self, drafts: list[str]) -> list[str]:
        """The target, the model each of `drafts` runs per step (early exits are read off the target's profile) and
        profiling.extra_models, profiled only to give the fit more layer widths."""
        names = [self.config["target"]]
        for name in drafts:
            cost = self.draft_kind(name).cost(name, self.draft_spec(name))
            if cost.model:
                names.append(cost.model)
        return list(dict.fromkeys(names + list(self.section("profiling").get("extra_models", []))))

    def profile_files(self, drafts: list[str]) -> list[str]:
        return [f"{self.paths.machine_dir}/profiles/{name}.csv" for name in self.profiled_models(drafts)]

    def head_profiles(self) -> dict:
        """{profile name: {vocab, dtype}} of the feature heads' draft steps among the drafts the machine's fit prices
        (prediction.head_profile_name): profiled with the fit's models, as an untrained head of that vocabulary and
        dtype (a step costs the same whatever its weights, so no training is needed to price it)."""
        heads = {}
        for name in self.machine_fit_drafts():
            spec = self.draft_spec(name)
            cost = self.draft_kind(name).cost(name, spec)
            if cost.head_layer:
                base = self.draft_spec(spec["head"]) if spec.get("head") else {}
                vocab, dtype = head_step(cost, base)
                heads[head_profile_name(vocab, dtype)] = {"vocab": vocab, "dtype": dtype}
        return dict(sorted(heads.items()))

    def head_profile_files(self) -> list[str]:
        return [f"{self.paths.machine_dir}/profiles/{name}.csv" for name in self.head_profiles()]

    @property
    def random_weights(self) -> bool:
        """profiling.weights random: the profiles time random weights of the real shapes (no weights needed)."""
        return self.section("profiling").get("weights") == "random"

    def random_architecture(self, name: str) -> dict:
        """The Hugging Face config a profiled model's random weights take: profiling.architectures' entry for it, or
        for a cut of a model (a truncated draft) that model's with the cut's layer count."""
        architectures = self.section("profiling").get("architectures") or {}
        if name in architectures:
            return dict(architectures[name])
        spec = self.draft_spec(name) if name not in self.config["models"] else {}
        if spec.get("model") in architectures and spec.get("layers"):
            return {**architectures[spec["model"]], "num_hidden_layers": int(spec["layers"])}
        raise PlanError(f"config key 'profiling.architectures.{name}': profiling.weights 'random' profiles {name!r} "
                        "on random weights of its shape, and no architecture is given for it")

    def profiled_source(self, name: str) -> tuple[str | None, int | None]:
        """(the weights a profiled model loads, how many of its first layers run (None: all)): its prepared model
        directory, or in the gguf regime its GGUF file (a truncated cut: its model's file, cut at load); with
        profiling.weights random none (random weights of random_architecture(name))."""
        if self.random_weights:
            if self.gguf:
                raise PlanError("config key 'profiling.weights': 'random' times Hugging Face models of random "
                                "weights; the gguf regime profiles the GGUF files themselves")
            self.random_architecture(name)  # refused at planning where it has none
            return None, None
        if not self.gguf:
            return model_dir(name), None
        if name in self.config["models"]:
            return gguf_file(name), None
        source = gguf_draft_source(name, self.draft_spec(name))
        if not source:
            raise PlanError(f"{name!r} runs no GGUF file: it has no profile in the gguf regime")
        return gguf_file(source[0]), source[1]

    # --- kernel tables ----------------------------------------------------------------------------------------
    @property
    def times_kernels(self) -> bool:
        """Whether this run's jobs read kernel tables: fp32/bf16 weights on a timed linear kernel (a GGUF file's
        product is one order-fixed kernel)."""
        return not self.gguf and self.runtime["linear_kernel"] in TIMED_KERNELS

    def kernel_table(self, model: str, dtype: str = "float32") -> str:
        """The machine's timings of the linear products on `model`'s weights held in `dtype`, for this build of the
        native kernels."""
        suffix = "" if dtype == "float32" else f".{dtype}"
        return f"{self.paths.machine_dir}/kernels/{self.kernel_build}/{model}{suffix}.csv"

    def draft_dtype(self, draft: str) -> str:
        return self.draft_spec(draft).get("dtype") or self.runtime["dtype"]

    def kernel_inputs(self, draft: str | None = None) -> dict:
        """The kernel tables a job that loads the target (and `draft`'s model, if it has one) runs with (none for
        GGUF weights: their product is one order-fixed kernel)."""
        if not self.times_kernels:
            return {}
        tables = {"target_kernels": self.kernel_table(self.config["target"], self.runtime["dtype"])}
        if draft and self.draft_hf_model_name(draft):
            tables["draft_kernels"] = self.kernel_table(self.draft_hf_model_name(draft), self.draft_dtype(draft))
        return tables

    def profiled_kernel_input(self, profiled: str) -> dict:
        """A profile's kernel table (none for random weights: there is no model directory to time them on; the
        profile then times the products as the runtime picks them without tables)."""
        if not self.times_kernels or self.random_weights:
            return {}
        return {"kernels": self.kernel_table(profiled, self.runtime["dtype"])}

    def random_architectures(self, names: list[str]) -> dict:
        """{name: its architecture} of the profiled models where profiling.weights is random, else {}."""
        return {name: self.random_architecture(name) for name in names} if self.random_weights else {}

    def study_kernel_tables(self) -> list[str]:
        """The kernel tables the study's decoding jobs read (provenance records what they chose)."""
        if not self.times_kernels:
            return []
        tables = [self.kernel_table(self.config["target"], self.runtime["dtype"])]
        tables += [self.kernel_table(self.draft_hf_model_name(d), self.draft_dtype(d)) for d in self.config["drafts"]
                   if self.draft_hf_model_name(d)]
        return list(dict.fromkeys(tables))

    # --- the machine's fit and the other machines' ------------------------------------------------------------
    def measured_machine_dirs(self) -> list[str]:
        """The fits of every machine measured so far (committed under machines_dir), besides this one's."""
        found = {str(Path(p).parent) for p in glob.glob(f"{self.paths.machines}/*/*/costmodel_terms.csv")}
        return sorted(found - {self.paths.machine_dir})

    def machine_fit_files(self) -> list[str]:
        """What a machine's directory must hold to join the verdict: its fit, its measured read bandwidth, its
        shapes."""
        return [f"{self.paths.machine_dir}/{name}" for name in
                ("costmodel_terms.csv", "bandwidth.json", "shapes.csv", "fitted_drafts_c.csv")]

    def machine_fit_drafts(self) -> list[str]:
        """Every draft the config names (the study's, the sweep's, every draft kind, every model but the target):
        the machine's fit prices each of them that its profiles can (machine_fit); in the gguf regime, those that
        run there (no bf16 copy, no weights of their own but a feature head's)."""
        models = [m for m in self.config["models"] if m != self.config["target"]]
        names = [*self.config["drafts"], *self.sweep_drafts(), *self.section("draft_kinds"), *models]
        return [name for name in dict.fromkeys(names) if self.runs_in_regime(name)]
