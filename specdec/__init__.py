"""SpecDec: exact speculative decoding, verified and measured."""

__version__ = "0.1.0"
