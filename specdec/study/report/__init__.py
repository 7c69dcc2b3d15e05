"""From per-sequence rows to the study's tables."""
