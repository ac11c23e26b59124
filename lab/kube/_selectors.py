"""Kubernetes label selectors (equality- and set-based) as predicates over an object's labels."""
from __future__ import annotations

import re
from typing import Callable, Mapping

Predicate = Callable[[Mapping[str, str]], bool]

_SET_TERM = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([\w./-]+)\s*(==|!=|=)\s*([\w.-]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*$")


class SelectorError(ValueError):
    """The selector text does not parse; the server answers 400 BadRequest."""


def _split_terms(text: str) -> list[str]:
    # Commas separate terms, except inside the parentheses of `in (a,b)`.
    terms, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def _term(term: str) -> Predicate:
    if match := _SET_TERM.match(term):
        key, op, raw = match.groups()
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQ_TERM.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_TERM.match(term):
        negate, key = match.groups()
        return (lambda labels: key not in labels) if negate else (lambda labels: key in labels)
    raise SelectorError(f"unable to parse requirement: {term!r}")


def parse_label_selector(text: str) -> Predicate:
    """Compile `a=b,c!=d,e in (x,y),!f` into one predicate; all terms must hold.

    Args:
        text: the `labelSelector` query parameter; empty selects everything.
    Returns:
        a function of an object's labels.
    Raises:
        SelectorError: when a term does not parse.
    """
    predicates = [_term(t) for t in _split_terms(text or "")]
    return lambda labels: all(p(labels) for p in predicates)
