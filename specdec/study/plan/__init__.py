"""The study's plan, what workflow/rules/*.smk schedule, as plain functions of a validated config and the run's
paths, testable without Snakemake (tests/test_plan.py). One class per stage, each over the ones it asks:

- run: RunPaths (results, logs, benchmarks, machine directory), model and GGUF paths, PlanError, PlanBase
- drafts: DraftPlan (a draft's spec and kind, the weights it loads, what runs in the gguf regime)
- prompts: PromptPlan (the prompt-source files a prompt set reads, the evaluation's selection)
- decoding: DecodingPlan (the decode grid, the distribution check, the draft sweep, peers, reproduce, distillation)
- costmodel: CostModelPlan (profiles, kernel tables, the machine's fit and the other machines')
- llamacpp: LlamacppPlan (the llamacpp stage and the side-by-side job)
- study: StudyPlan, all of them, and the gguf regime's check at start
"""

from .costmodel import TIMED_KERNELS
from .run import PlanError, RunPaths, gguf_file, gguf_tokenizer_dir, model_dir, one_of
from .study import StudyPlan

__all__ = ["PlanError", "RunPaths", "StudyPlan", "TIMED_KERNELS", "gguf_file", "gguf_tokenizer_dir", "model_dir",
           "one_of"]
