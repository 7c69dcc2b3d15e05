"""Training drafts: distilled drafts and feature heads, their data and offline checks."""
