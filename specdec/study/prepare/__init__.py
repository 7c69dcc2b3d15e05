"""Preparing what the study reads: model weights, pinned wheels, prompt sets."""
