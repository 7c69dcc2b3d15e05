"""Decoding jobs: baseline and speculative, interleaved in one process."""
