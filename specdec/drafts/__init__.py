"""Draft proposers and the registry of draft kinds.

`base` has the interface (Proposal, DraftProposer); `model`, `lookup`, `early_exit` and `hybrid` the proposers;
`registry` what a kind of draft declares, and `kinds` registers the built-in ones (importing this package does).
"""

from . import kinds  # noqa: F401  (registers the built-in kinds)
from .base import DraftProposer, Proposal, as_proposer
from .early_exit import EarlyExitDraft, early_exit_model
from .hybrid import HybridDraft
from .lookup import PromptLookupDraft
from .model import ModelDraft
from .registry import (
           DraftCost,
           DraftKind,
           DraftResources,
           get_kind,
           kind_names,
           load_plugins,
           register,
)

__all__ = ["DraftProposer", "Proposal", "as_proposer", "ModelDraft", "PromptLookupDraft", "EarlyExitDraft",
           "early_exit_model", "HybridDraft", "DraftCost", "DraftKind", "DraftResources", "get_kind", "kind_names",
           "load_plugins", "register"]
