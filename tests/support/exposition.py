"""Expositions written as an exporter writes them (fixtures/exposition), with the counts of one
histogram family set per scrape: the tests keep the exporter's names, labels, bound formats and
line order and make the numbers."""
from __future__ import annotations

import re
from typing import Mapping

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$')


def rewrite(template: str, family: str, version_label: str,
            values: Mapping[str, Mapping[str, float]]) -> str:
    """The template exposition with `family`'s samples of each version set from `values`
    (version -> {le as written, "count", "sum"}): names, labels, bound formats and order stay the
    exporter's."""
    out = []
    for line in template.splitlines():
        m = _LINE.match(line)
        if m and m.group(1).startswith(family):
            name, labels = m.group(1), m.group(2)
            version = re.search(rf'\b{version_label}="([^"]*)"', labels)
            le = re.search(r'\ble="([^"]*)"', labels)
            table = values.get(version.group(1)) if version else None
            if table is not None:
                key = le.group(1) if name.endswith("_bucket") and le else name.rsplit("_", 1)[1]
                if key in table:
                    line = f"{name}{{{labels}}} {table[key]:.17g}"
        out.append(line)
    return "\n".join(out) + "\n"


def cumulative(bounds: list[str], fast: int, slow: int, slow_at: float, total: int) -> dict[str, float]:
    """Bucket counts of `fast` requests at the smallest bound and `slow` at `slow_at`."""
    table: dict[str, float] = {}
    for b in bounds:
        bound = float(b)
        table[b] = fast + (slow if bound >= slow_at else 0)
    table["count"] = total
    table["sum"] = 0.0
    return table
