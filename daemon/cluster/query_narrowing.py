"""A fleet-wide query narrowed to the models a replica leads, where its selector allows: pure.

PromQL has no hash function, so a query cannot be cut to a shard; it can be cut to the shard's
targets by a label matcher. Only a plain vector selector (`metric`, `metric{...}`, `{...}`) is
rewritten: it gains `<modelLabel>=~"m1|m2"` (anchored, as Prometheus anchors every regex matcher),
which keeps exactly the series the poller routes to those models' policies. Anything else (functions,
aggregations, operators, offsets) is left whole: rewriting every selector inside an expression needs
a PromQL parser, and a wrong rewrite would change what a detector sees.
"""
from __future__ import annotations

import re
from typing import Iterable

from core.promql import label_matcher

# name? { matchers }? with quoted values that may hold braces or escaped quotes
_SELECTOR = re.compile(r'^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)?\s*'
                       r'(?:\{(?P<matchers>(?:[^{}"]|"(?:\\.|[^"\\])*")*)\})?\s*$')
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def regex_escape(value: str) -> str:
    """`value` matched literally inside an RE2 regex (Prometheus' regex matchers)."""
    return _RE2_SPECIAL.sub(r"\\\1", value)


def narrow_selector(query: str, label: str, values: Iterable[str]) -> str | None:
    """`query` with `label=~"v1|v2"` added to its matchers, if it is a plain vector selector and there
    is at least one value; None when it cannot be narrowed (the caller fetches it whole)."""
    wanted = sorted(set(values))
    match = _SELECTOR.match(query)
    if not wanted or match is None or not (match["name"] or (match["matchers"] or "").strip()):
        return None
    try:
        added = label_matcher(label, "|".join(regex_escape(v) for v in wanted), "=~")
    except ValueError:  # not a label name: nothing to narrow by
        return None
    existing = (match["matchers"] or "").strip().rstrip(",").strip()
    return f"{match['name'] or ''}{{{existing + ', ' if existing else ''}{added}}}"


def narrowable(query: str, label: str) -> bool:
    """Whether `narrow_selector` can narrow `query` by `label`."""
    return narrow_selector(query, label, ["x"]) is not None
