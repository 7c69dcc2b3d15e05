"""Exactness checks: greedy identity with near-tie diagnosis, and the distribution check."""
