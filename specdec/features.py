"""The target's features as a session keeps them: its final hidden states (after the final norm: what the LM head
reads) of every position it has computed, for a draft that reads them (specdec.drafts.feature_head); and, where the
draft fuses some of the target's layers (EAGLE-3's low, middle and high features), those layers' outputs beside them:
a row is [final hidden state, output of layer a, output of layer b, ...], each `hidden` wide."""

from __future__ import annotations

from typing import Sequence

import torch


def checked_layers(layers: Sequence[int], n_layers: int | None) -> tuple[int, ...]:
    """`layers` as a tuple, once each increasing, each a decoder layer of a model of n_layers (None: any number of
    layers); a clear error else."""
    layers = tuple(layers)
    bound = float("inf") if n_layers is None else n_layers
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < bound for i in layers) \
            or list(layers) != sorted(set(layers)):
        where = "(0-based)" if n_layers is None else f"in 0..{n_layers - 1}"
        raise ValueError(f"feature layers {list(layers)}: increasing distinct decoder layers {where}")
    return layers


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
    feature_layers: tuple[int, ...] = ()

    def keep_hidden_states(self, layers: Sequence[int] = ()) -> None:
        """From now on keep the final hidden state (after the final norm: what the LM head reads) of every position
        the session computes, for a draft that reads them (a feature head), and the outputs of decoder `layers`
        (0-based; the residual stream after each) beside it. The forward computes them anyway."""
        layers = checked_layers(layers, self._decoder_layers())
        if self._features is not None and layers != self.feature_layers:
            raise ValueError(f"this session already keeps the outputs of layers {list(self.feature_layers)} with its "
                             f"features; asked for {list(layers)}")
        if self._features is None:
            self.feature_layers = layers
            self._features = FeatureBuffer(first=self.length)

    def _decoder_layers(self) -> int:
        """How many decoder layers the session runs (the layers it can keep are 0 .. that - 1)."""
        raise NotImplementedError

    def hidden_states(self, start: int, end: int) -> torch.Tensor:
        """(end - start, hidden x (1 + len(feature_layers))) final hidden states of positions start..end-1, with
        the kept layers' outputs beside them (keep_hidden_states first)."""
        if self._features is None:
            raise RuntimeError("hidden_states needs keep_hidden_states() before the positions are computed")
        return self._features.rows(start, end)

    def _crop_features(self, length: int) -> None:
        if self._features is not None:
            self._features.crop(length)
