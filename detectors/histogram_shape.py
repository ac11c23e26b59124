"""What a latency histogram's own exposition says before any test reads it: its unit (from its
name), the bounds its exporter uses by default, and whether one scrape of it (cumulative buckets,
a `+Inf` bucket equal to the count) or two in a row (the same bounds) can be read as counts above
a line at all.

Pure. The direct Triton reader (daemon/sources/triton_metrics.py) checks every scrape with it, and
`tailguard validate` the unit and bounds a policy names (policies/evidence_price.py). The facts
behind the tables are in docs/stack-facts.md, "Latency histograms", with their sources.
"""
from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
"""The units a line or a histogram can be in, as seconds."""

_SUFFIXES = (("_seconds", "s"), ("_milliseconds", "ms"), ("_ms", "ms"), ("_microseconds", "us"), ("_us", "us"))
_SERIES = ("_bucket", "_count", "_sum", "_total")
_NAME = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")

TRITON_FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
ISTIO_DURATION = "istio_request_duration_milliseconds"
ENVOY_DEFAULT_BOUNDS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000,
                        600000, 1800000, 3600000)
"""Envoy's default histogram bounds (ms), Istio's standard metrics' unless the mesh overrides them."""

DEFAULT_BOUNDS: dict[str, tuple[tuple[float, ...], str]] = {
    TRITON_FIRST_RESPONSE: ((100, 500, 2000, 5000),
                            "Triton's default for nv_inference_first_response_histogram_ms; a model's config "
                            "overrides it with model_metrics.histogram_options"),
    ISTIO_DURATION: (ENVOY_DEFAULT_BOUNDS, "Envoy's default buckets, which Istio's standard metrics use unless "
                                          "the mesh sets its own (the proxy's histogram bucket settings)"),
}
"""Histograms whose exporter has documented default bounds: (bounds in the histogram's unit, whose)."""


def metric_name(query: str) -> str | None:
    """The metric a plain selector names (`name{...}`), None for anything else."""
    m = _NAME.match(query)
    if m is None or query[m.end():].lstrip()[:1] not in ("", "{"):
        return None
    return m.group(1)


def histogram_base(name: str) -> str:
    """The family a series belongs to: `x_bucket`, `x_count`, `x_sum` -> `x`."""
    for suffix in _SERIES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def metric_unit(name: str) -> str | None:
    """The unit a metric's name states by Prometheus' naming convention (`_seconds`, `_milliseconds`
    or `_ms`, `_microseconds` or `_us`), None when it states none."""
    base = histogram_base(name)
    for suffix, unit in _SUFFIXES:
        if base.endswith(suffix):
            return unit
    return None


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """`value` in `from_unit` expressed in `to_unit` (both keys of UNIT_SECONDS)."""
    return value * UNIT_SECONDS[from_unit] / UNIT_SECONDS[to_unit]


def unit_problem(query: str, line: float, line_unit: str | None) -> str | None:
    """Where the policy states the line's unit and the query's metric states another, the line the
    policy means in the metric's unit (never converted silently: the bucket bounds and latency
    sums are in the metric's unit, so the line must be written in it); a stated unit the metric's
    name does not confirm is refused too."""
    if line_unit is None:
        return None
    name = metric_name(query)
    unit = metric_unit(name) if name is not None else None
    if unit is None:
        return (f"line_unit: {line_unit} cannot be checked: the query's metric "
                f"{name or query!r} states no unit in its name (_seconds, _milliseconds/_ms, _microseconds/_us); "
                "write the line in the metric's unit and drop line_unit")
    if unit == line_unit:
        return None
    return (f"the line is {line:g} {line_unit} but {histogram_base(name or query)} is in {unit}: write line: {convert(line, line_unit, unit):g} "
            f"(and line_unit: {unit}); the bounds and sums are in the metric's unit, nothing is converted")


def bounds_note(query: str, bound: float) -> str | None:
    """A bucket bound a known exporter does not have by default (a series that will not exist
    unless the exporter is configured for it), None when it has it or the metric is not known."""
    name = metric_name(query)
    known = DEFAULT_BOUNDS.get(histogram_base(name)) if name is not None else None
    if known is None or math.isinf(bound):
        return None
    bounds, whose = known
    if any(math.isclose(bound, b) for b in bounds):
        return None
    return (f"le={bound:g} is not among {', '.join(f'{b:g}' for b in bounds)} ({whose}): the bucket exists only "
            f"where that default is overridden to include it")


def snapshot_problem(buckets: Mapping[float, float], count: float | None) -> str | None:
    """Why one scrape of one histogram (bucket bound -> cumulative count, and its `_count`) cannot
    be read as counts above a line, None when it can: no `+Inf` bucket, a value that is not a
    number, buckets that decrease with the bound (not cumulative), a count other than `+Inf`'s."""
    if any(not math.isfinite(v) for v in buckets.values()) or (count is not None and not math.isfinite(count)):
        return "a bucket or the count is not a number"
    if math.inf not in buckets:
        return 'no le="+Inf" bucket (an exposition must end each histogram with it)'
    ordered = sorted(buckets.items())
    for (low, low_count), (high, high_count) in zip(ordered, ordered[1:]):
        if high_count < low_count:
            return (f"buckets decrease: le={low:g} counts {low_count:g} but le={high:g} counts {high_count:g} "
                    "(not cumulative)")
    if count is not None and count != buckets[math.inf]:
        return f'the count {count:g} differs from the le="+Inf" bucket {buckets[math.inf]:g}'
    return None


def bounds_change(before: Sequence[float], after: Sequence[float]) -> str | None:
    """Why two scrapes of one histogram are not one series of counts (its bounds changed, as after
    a config change), None when the bounds are the same."""
    if tuple(before) == tuple(after):
        return None
    return f"bounds changed between scrapes ({_list(before)} -> {_list(after)})"


def bound_at_or_above(bounds: Sequence[float], line: float) -> float | None:
    """The lowest finite bound at or above the line, None when none is (only `+Inf` above it)."""
    above = [b for b in bounds if b >= line and math.isfinite(b)]
    return min(above) if above else None


def _list(bounds: Sequence[float]) -> str:
    return ", ".join("+Inf" if math.isinf(b) else f"{b:g}" for b in bounds)
