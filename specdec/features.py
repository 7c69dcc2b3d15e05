"""The target's features as a session keeps them: its final hidden states (after the final norm: what the LM head
reads) of every position it has computed, for a draft that reads them (specdec.drafts.feature_head)."""

from __future__ import annotations

import torch


class FeatureBuffer:
    """Rows of positions first..length-1, appended per forward and cut back at a crop, in a buffer that doubles (no
    copy of the whole per step). first: the session's length when it began keeping them (earlier ones are unknown)."""

    def __init__(self, first: int = 0):
        self._rows: torch.Tensor | None = None
        self.first = self.length = first

    def append(self, rows: torch.Tensor) -> None:
        rows = rows.detach()
        held, end = self.length - self.first, self.length - self.first + rows.shape[0]
        if self._rows is None or end > self._rows.shape[0] or self._rows.dtype != rows.dtype:
            grown = rows.new_empty((max(2 * end, 64), rows.shape[1]))
            if self._rows is not None and held:
                grown[:held] = self._rows[:held]
            self._rows = grown
        self._rows[held:end] = rows
        self.length += rows.shape[0]

    def rows(self, start: int, end: int) -> torch.Tensor:
        if not self.first <= start <= end <= self.length:
            raise IndexError(f"hidden states of positions {start}..{end - 1} asked; positions {self.first}.."
                             f"{self.length - 1} are held (kept from position {self.first} on)")
        return self._rows[start - self.first:end - self.first]

    def crop(self, length: int) -> None:
        if length < self.first:  # a reset or a crop below what was kept: start again from there
            self.first = length
        self.length = min(self.length, length)


class KeepsFeatures:
    """The verbs a session gives a draft that reads its features (`keep_hidden_states`, `hidden_states`), over a
    FeatureBuffer the session appends to in its forward and cuts back in `_crop_features` at crop and reset.
    The session has a `length` (positions it holds)."""

    _features: FeatureBuffer | None = None

    def keep_hidden_states(self) -> None:
        """From now on keep the final hidden state (after the final norm: what the LM head reads) of every position
        the session computes, for a draft that reads them (a feature head). The forward computes them anyway."""
        if self._features is None:
            self._features = FeatureBuffer(first=self.length)

    def hidden_states(self, start: int, end: int) -> torch.Tensor:
        """(end - start, hidden) final hidden states of positions start..end-1 (keep_hidden_states first)."""
        if self._features is None:
            raise RuntimeError("hidden_states needs keep_hidden_states() before the positions are computed")
        return self._features.rows(start, end)

    def _crop_features(self, length: int) -> None:
        if self._features is not None:
            self._features.crop(length)
