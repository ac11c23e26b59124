"""Metric query results and series identity. An instant answer is three-way: a value, no data, or
an error; no data is never healthy."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    timestamps: Sequence[float]  # unix seconds
    values: Sequence[float]


# What json.dumps(..., separators=(",", ":")) builds on every call (non-default arguments skip its
# cached encoder), built once: the same bytes, and a poll cycle asks for one key per series.
_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"))


def series_key(labels: Mapping[str, str]) -> str:
    """A series' identity: the JSON of its sorted labels. The journal and signal dedup keys store
    this exact encoding, so changing it would split one series' history in two."""
    return _KEY_ENCODER.encode(dict(sorted(labels.items())))


@dataclass(frozen=True)
class QueryResult:
    """The answer to one instant query. Exactly one of: samples (non-empty), no_data, error."""

    query: str
    samples: tuple[Sample, ...] = ()
    error: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def no_data(self) -> bool:
        return self.error is None and not self.samples

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.samples)


class NoDataError(Exception):
    """A query answered with no series; acting on it would read silence as health."""


class MultipleValuesError(Exception):
    """A query meant to return one value returned several; the caller must aggregate explicitly."""


def single_value(result: QueryResult) -> float:
    """The one value of a result, or a distinct error for error / no data / several values."""
    if result.error is not None:
        raise RuntimeError(f"query failed: {result.error} (query: {result.query})")
    if not result.samples:
        raise NoDataError(f"query returned no data: {result.query}")
    if len(result.samples) > 1:
        raise MultipleValuesError(
            f"query returned {len(result.samples)} series, expected one: {result.query}"
        )
    return result.samples[0].value
