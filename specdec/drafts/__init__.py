"""Draft proposers and the registry of draft kinds.

`base` has the interface (Proposal, DraftProposer); `model`, `lookup`, `early_exit` and `hybrid` the proposers;
`registry` what a kind of draft declares, and `kinds` registers the built-in ones (importing this package does).
The registry imports neither torch nor transformers (the workflow reads it at every start-up); the proposers are
imported on first use of their names.
"""

import importlib

from . import kinds  # noqa: F401  (registers the built-in kinds)
from .registry import (
           DraftCost,
           DraftKind,
           DraftResources,
           check_spec,
           get_kind,
           kind_names,
           load_plugins,
           register,
)

_LAZY = {"DraftProposer": "base", "Proposal": "base", "as_proposer": "base", "EarlyExitDraft": "early_exit",
         "early_exit_model": "early_exit", "HybridDraft": "hybrid", "PromptLookupDraft": "lookup",
         "ModelDraft": "model"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DraftProposer", "Proposal", "as_proposer", "ModelDraft", "PromptLookupDraft", "EarlyExitDraft",
           "early_exit_model", "HybridDraft", "DraftCost", "DraftKind", "DraftResources", "check_spec", "get_kind",
           "kind_names", "load_plugins", "register"]
