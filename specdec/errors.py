"""Errors shared across modules."""


class VocabularyMismatchError(ValueError):
    """Draft and target do not share a vocabulary, so q and p are not over the same tokens."""


class DraftSpecError(ValueError):
    """A draft's declaration (its kind and fields) is not one the registry can build; the message names the key."""


class InvalidModelDirError(RuntimeError):
    """A model directory lacks what a prepared model has (config, safetensors, tokenizer, manifest)."""
