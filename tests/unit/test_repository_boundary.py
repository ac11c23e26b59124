"""No dict or positional tuple crosses a repository boundary (issue 43): every public method of every
journal repository takes and returns named records, sequences of them, or scalars. What a method's
annotations say is what its callers get, so the check reads them (typing.get_type_hints) for every
repository the Journal holds, a new one included.

Flagged anywhere inside a parameter's or a return's annotation (in a list, a union, a Future, a
Callable's arguments): a bare `dict`, a dict or Mapping whose values are Any, and a positional
tuple (`tuple`, `tuple[str, float]`). Not flagged: `tuple[X, ...]` (an immutable sequence, not
positions), a Mapping of typed values (Starts' version -> start time is a mapping, not a row), and
record classes (dataclasses, and NamedTuples, whose fields are named and typed)."""
from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import tomllib
import typing
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple

from daemon.storage.blocking import blocking
from daemon.storage.journal import Journal

ROOT = Path(__file__).resolve().parents[2]

# (repository class, method, parameter or "return") -> why it may carry a dict or a tuple.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("Decisions", "record", "plan"): "the plan document, a JSON column written whole; its keys are the plan's, "
                                     "not a row's",
    ("Approvals", "request", "plan"): "the plan waiting for approval, the same JSON document as Decisions.record's",
    ("Decisions", "finish", "expired"): "why a decision expired (why, age), merged into the plan's JSON document",
    ("Decisions", "record_verdict", "data"): "the recovery verdict's evidence, free-form per check, a JSON column",
    ("Effects", "record", "data"): "the door's request data, free-form per writer (replica, loads, intent), "
                                   "a JSON column",
}

_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def offences(hint: object) -> list[str]:
    """What in the annotation `hint` is a bare dict, an Any-valued dict or Mapping, or a positional tuple."""
    if hint is dict or hint is typing.Dict:  # noqa: UP006 (the typing alias is what is looked for)
        return ["bare dict"]
    if hint is tuple or hint is typing.Tuple:  # noqa: UP006
        return ["bare tuple"]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    found: list[str] = []
    if origin in _MAPPINGS and (not args or args[-1] is Any):
        found.append(f"Any-valued mapping {hint}")
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        found.append(f"positional tuple {hint}")
    for arg in args:
        for inner in (arg if isinstance(arg, list) else [arg]):  # a Callable's parameters come as a list
            if inner is not Ellipsis:
                found += offences(inner)
    return found


def public_methods(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """(name, function) of the class's public methods, a `@blocking` one unwrapped to its function."""
    for klass in cls.__mro__[:-1]:
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, blocking):
                yield name, member.__wrapped__
            elif isinstance(member, (staticmethod, classmethod)):
                yield name, member.__func__
            elif isinstance(member, property) and member.fget is not None:
                yield name, member.fget
            elif inspect.isfunction(member):
                yield name, member


def violations(cls: type) -> dict[tuple[str, str, str], list[str]]:
    """(class, method, parameter or "return") -> what crosses there that should not."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for name, fn in public_methods(cls):
        for param, hint in typing.get_type_hints(fn).items():
            found = offences(hint)
            if found:
                out[(cls.__name__, name, param)] = found
    return out


def repositories() -> list[type]:
    """The classes of the repositories a Journal holds (those that keep the journal's core)."""
    j = Journal(":memory:")
    try:
        return sorted({type(r) for r in vars(j).values() if getattr(r, "_core", None) is j},
                      key=lambda c: c.__name__)
    finally:
        j.close()


def test_no_dict_or_positional_tuple_crosses_a_repository_boundary():
    found: dict[tuple[str, str, str], list[str]] = {}
    for cls in repositories():
        found |= violations(cls)
    unexplained = {where: what for where, what in found.items() if where not in ALLOWED}
    assert unexplained == {}
    # An allowance for what no longer crosses goes with it (the list says what is left, no more).
    assert sorted(set(ALLOWED) - set(found)) == []


def test_every_repository_of_the_independence_contract_is_checked():
    """The check finds the repositories through the Journal: each module of pyproject.toml's
    independence contract must be among them, or a repository would escape it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "independence"]
    assert {cls.__module__ for cls in repositories()} >= set(contract["modules"])


class _Point(NamedTuple):
    x: float
    y: float


@dataclasses.dataclass(frozen=True)
class _Row:
    id: int


class _Leaky:
    """What the check must catch, and what it must let through."""

    def __init__(self) -> None:
        self._core = None

    def rows(self) -> list[dict[str, Any]]: ...
    def raw(self) -> dict: ...  # type: ignore[type-arg]
    def pairs(self, items: typing.Sequence[tuple[str, float]]) -> None: ...
    def maybe(self) -> tuple[int, int] | None: ...
    def listener(self, fn: Callable[[list[tuple[int, str]]], None]) -> None: ...
    def config(self, options: Mapping[str, Any]) -> None: ...
    @blocking
    def wrapped(self) -> list[dict[str, Any]]: ...

    def records(self) -> list[_Row]: ...
    def points(self) -> tuple[_Point, ...]: ...
    def starts(self, starts: Mapping[str, float]) -> frozenset[int]: ...
    def _private(self) -> dict[str, Any]: ...


def test_the_check_catches_dicts_and_positional_tuples_and_lets_records_through():
    assert set(violations(_Leaky)) == {("_Leaky", name, where) for name, where in [
        ("rows", "return"), ("raw", "return"), ("pairs", "items"), ("maybe", "return"),
        ("listener", "fn"), ("config", "options"), ("wrapped", "return")]}
