"""The decoding jobs each target asks for: the study's grid (decoding), the distribution check's drafts, the draft
sweep's cells (per_draft overrides), the peers' and reproduce's subsets, and a distilled draft's training."""

from __future__ import annotations

import itertools

from .drafts import DraftPlan


class DecodingPlan(DraftPlan):
    # --- the study's grid -------------------------------------------------------------------------------------
    def decode_jobs(self, setting: str | None = None) -> list[tuple]:
        """(setting, draft, domain, k, seed) of every decoding job the config asks for (of one setting, if given)."""
        decoding, drafts = self.decoding, self.config["drafts"]
        domains = decoding.get("domains") or self.domains
        jobs = []
        if decoding.get("greedy", True):
            jobs += [("greedy", d, dom, k, 0) for d, dom, k in itertools.product(drafts, domains, decoding["k"])]
        sampled = decoding.get("sampled")
        if sampled:
            ks, sampled_drafts = sampled.get("k") or decoding["k"], sampled.get("drafts") or drafts
            jobs += [("sampled", d, dom, k, s) for d, dom, k, s in
                     itertools.product(sampled_drafts, domains, ks, sampled["seeds"])]
        return [job for job in jobs if setting is None or job[0] == setting]

    def run_files(self, name: str, setting: str | None = None) -> list[str]:
        """The `name` file (steps.parquet / sequences.parquet) of every decoding job."""
        return [f"{self.paths.results}/runs/{s}/{d}/{dom}/k{k}/seed{seed}/{name}"
                for s, d, dom, k, seed in self.decode_jobs(setting)]

    def sampling_params(self, setting: str) -> dict:
        """A setting's sampling: greedy, or decoding.sampled's temperature, top_k and top_p."""
        if setting == "greedy":
            return {"temperature": 0.0, "top_k": None, "top_p": None}
        sampled = self.decoding["sampled"]
        return {"temperature": float(sampled["temperature"]), "top_k": sampled.get("top_k"),
                "top_p": sampled.get("top_p")}

    # --- the distribution check -------------------------------------------------------------------------------
    def distribution_drafts(self) -> list[str]:
        """Drafts the distribution check runs on: distribution_check.drafts, else every studied draft built on a
        model of `models` (truncated and distilled ones may be named)."""
        named = self.section("distribution_check").get("drafts")
        if named is not None:
            return named
        return [d for d in self.config["drafts"] if self.draft_kind(d).model == "named"]

    def distribution_files(self) -> list[str]:
        return [f"{self.paths.results}/verify/distribution/{d}/{dom}.parquet"
                for d in self.distribution_drafts() for dom in self.domains]

    # --- the draft sweep --------------------------------------------------------------------------------------
    @property
    def sweep_k(self) -> list[int]:
        """draft_sweep.k, else decoding.k: every k of a (draft, domain) cell, decoded in one job."""
        return self.section("draft_sweep").get("k") or self.decoding["k"]

    def sweep_drafts(self) -> list[str]:
        return list(self.section("draft_sweep").get("drafts") or [])

    def sweep_setting(self, draft: str, key: str, default):
        """A sweep setting for one draft: its per_draft override, else the sweep's, else `default`."""
        sweep = self.section("draft_sweep")
        return ((sweep.get("per_draft") or {}).get(draft) or {}).get(key) or sweep.get(key) or default

    def sweep_domains(self, draft: str) -> list[str]:
        return self.sweep_setting(draft, "domains", self.domains)

    def sweep_model_files(self) -> list[str]:
        """The weights the sweep decodes with: the target's and each sweep draft's (model directory, GGUF file, or
        a feature head's directory), for its provenance."""
        files = [self.target_input()]
        for draft in self.sweep_drafts():
            files += list(self.draft_model_input(draft).values())
        return list(dict.fromkeys(files))

    def sweep_benchmark_files(self) -> list[str]:
        return list(dict.fromkeys(f"{self.paths.benchmarks}/sweep/greedy/{d}/{dom}/seed0.tsv"
                                  for d in self.sweep_drafts() for dom in self.sweep_domains(d)))

    def sweep_run_files(self, name: str) -> list[str]:
        return [f"{self.paths.results}/sweep/runs/greedy/{d}/{dom}/k{k}/seed0/{name}"
                for d in self.sweep_drafts() for dom in self.sweep_domains(d) for k in self.sweep_k]

    # --- peers, reproduce, distillation -----------------------------------------------------------------------
    def peers_drafts(self) -> list[str]:
        """peers.drafts, else every studied draft Hugging Face's assisted generation can run (a plain model)."""
        named = self.section("peers").get("drafts")
        if named is not None:
            return named
        return [d for d in self.config["drafts"] if self.draft_kind(d).assisted(self.draft_spec(d))]

    def peers_files(self) -> list[str]:
        peers = self.section("peers")
        domains = peers.get("domains") or self.domains
        return [f"{self.paths.results}/peers/{d}/{dom}/k{k}.parquet" for d in self.peers_drafts() for dom in domains
                for k in peers.get("k", [4, 8])]

    def reproduce_cells(self) -> list[tuple]:
        """(draft, domain, k) of the greedy cells `reproduce` reruns: reproduce.drafts, domains and k, else the
        first draft, the first domain and k 4."""
        reproduce = self.section("reproduce")
        return [(d, dom, k) for d in reproduce.get("drafts", self.config["drafts"][:1])
                for dom in reproduce.get("domains", self.domains[:1]) for k in reproduce.get("k", [4])]

    def distill_training(self, distilled: str) -> dict:
        """distillation.training with the distilled draft's own overrides."""
        own = self.config["draft_kinds"][distilled].get("training", {})
        return {**self.section("distillation").get("training", {}), **own}
