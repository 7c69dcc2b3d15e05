"""Errors shared across modules."""


class VocabularyMismatchError(ValueError):
    """Draft and target do not share a vocabulary, so q and p are not over the same tokens."""
