"""PromQL text helpers: label values never reach a query unescaped."""
from __future__ import annotations

import re
from typing import Mapping

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_PLACEHOLDER = re.compile(r"\$\{([a-zA-Z_][a-zA-Z0-9_]*)\}|\$([a-zA-Z_][a-zA-Z0-9_]*)")


def escape_label_value(value: str) -> str:
    """Escape a string for use inside a double-quoted PromQL label matcher.

    PromQL strings follow Go's escaping rules; backslash, double quote and line breaks
    are the characters that could end the string or change its meaning.
    """
    return (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )


def label_matcher(name: str, value: str, op: str = "=") -> str:
    """`name="value"` with the value escaped; the name must be a valid label name."""
    if not _LABEL_NAME.match(name):
        raise ValueError(f"invalid Prometheus label name: {name!r}")
    if op not in ("=", "!=", "=~", "!~"):
        raise ValueError(f"invalid label match operator: {op!r}")
    return f'{name}{op}"{escape_label_value(value)}"'


def render_query(template: str, values: Mapping[str, str]) -> str:
    """Substitute `$name` / `${name}` placeholders with escaped label values.

    Placeholders are meant to sit inside double quotes in the template, e.g.
    ``nv_inference_request_summary_us{model="$model", quantile="0.999"}``.
    An unknown placeholder is an error, never an empty string.
    """

    def _sub(match: re.Match[str]) -> str:
        key = match.group(1) or match.group(2)
        if key not in values:
            raise KeyError(f"query placeholder ${key} has no value (known: {sorted(values)})")
        return escape_label_value(str(values[key]))

    return _PLACEHOLDER.sub(_sub, template)
