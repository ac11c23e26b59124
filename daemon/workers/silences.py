"""Alertmanager silences before acting on a detector signal: parse and match them (pure), and the
check the executor calls.

Operators' maintenance windows already live in Alertmanager as silences; a detector signal whose
target labels (the signal's labels plus `model`) an active silence matches is journaled as silenced
and not acted on. Matching follows Alertmanager: every matcher must match, a regex is anchored
(`^(?:re)$`), a missing label reads as the empty string. An Alertmanager that does not answer in
time does not hold remediation back: the check says "not checked" and the executor acts, recording
why (a freeze, not a silence, is the way to stop the daemon for sure).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

import structlog

from core.timestamps import iso_utc

log = structlog.get_logger("tailguard.silences")


@dataclass(frozen=True)
class Matcher:
    """One silence matcher: `name` `=`, `!=`, `=~` or `!~` `value`."""

    name: str
    value: str
    is_regex: bool = False
    is_equal: bool = True

    @property
    def op(self) -> str:
        return ("=" if self.is_equal else "!=") if not self.is_regex else ("=~" if self.is_equal else "!~")

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` satisfy this matcher (a missing label is the empty string)."""
        got = labels.get(self.name, "")
        if self.is_regex:
            try:
                hit = re.fullmatch(f"(?:{self.value})", got) is not None
            except re.error:  # RE2 syntax Python cannot read: this matcher matches nothing
                return False
        else:
            hit = got == self.value
        return hit if self.is_equal else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'


@dataclass(frozen=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    state: str | None = None  # Alertmanager's own view (active | pending | expired), when given
    created_by: str = ""
    comment: str = ""

    def active(self, now: float) -> bool:
        """Alertmanager's state when it says one, else the time window."""
        if self.state is not None:
            return self.state == "active"
        return self.starts_at <= now < self.ends_at

    def describe(self) -> str:
        by = f" by {self.created_by}" if self.created_by else ""
        why = f": {self.comment}" if self.comment else ""
        return f"silence {self.id}{by} until {iso_utc(self.ends_at)} ({', '.join(map(str, self.matchers))}){why}"


def silence_matches(silence: Silence, labels: Mapping[str, str], now: float) -> bool:
    """Active, has matchers, and every matcher matches `labels`."""
    return silence.active(now) and bool(silence.matchers) and all(m.matches(labels) for m in silence.matchers)


def matching_silences(silences: Iterable[Silence], labels: Mapping[str, str], now: float) -> list[Silence]:
    return [s for s in silences if silence_matches(s, labels, now)]


def parse_silences(doc: Any) -> list[Silence]:
    """The silences of a `GET /api/v2/silences` answer; entries that are not well-formed are skipped
    (lenient, like every input from Alertmanager: its fields keep growing).

    Raises:
        ValueError: the answer is not a list.
    """
    if not isinstance(doc, list):
        raise ValueError("GET /api/v2/silences did not answer a list")
    out = []
    for item in doc:
        try:
            out.append(_silence(item))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("silence skipped: not well-formed", error=repr(exc))
    return out


def _silence(item: Mapping[str, Any]) -> Silence:
    matchers = tuple(Matcher(str(m["name"]), str(m["value"]), bool(m.get("isRegex", False)),
                             bool(m.get("isEqual", True))) for m in item["matchers"])
    status = item.get("status")
    state = status.get("state") if isinstance(status, Mapping) else None
    return Silence(str(item["id"]), matchers, _unix(item["startsAt"]), _unix(item["endsAt"]),
                   str(state) if state is not None else None, str(item.get("createdBy", "")),
                   str(item.get("comment", "")))


def _unix(text: str) -> float:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class SilenceVerdict:
    """What the check found: the silences that match (silenced), or why none could be checked."""

    matched: tuple[Silence, ...] = ()
    error: str | None = None

    @property
    def silenced(self) -> bool:
        return bool(self.matched)

    @property
    def reason(self) -> str:
        if self.matched:
            return f"silenced in Alertmanager: {self.matched[0].describe()}"
        return f"silences not checked: {self.error}" if self.error else "no silence matches"


SilenceCheck = Callable[[Mapping[str, str]], Awaitable[SilenceVerdict]]
"""Asks whether an active silence matches these labels; never raises."""


class SilenceChecker:
    """Reads the silences through `fetch` (the Alertmanager client) and matches them."""

    def __init__(self, fetch: Callable[[], Awaitable[Any]], clock: Callable[[], float] = time.time,
                 on_result: Callable[[str], None] = lambda result: None) -> None:
        self._fetch = fetch
        self._clock = clock
        self._on_result = on_result  # silenced | clear | unavailable (metrics)

    async def __call__(self, labels: Mapping[str, str]) -> SilenceVerdict:
        try:
            silences = parse_silences(await self._fetch())
        except Exception as exc:  # down, slow, or not an answer: never blocks remediation (module doc)
            self._on_result("unavailable")
            log.warning("Alertmanager silences not checked; acting without them", error=str(exc))
            return SilenceVerdict(error=str(exc) or type(exc).__name__)
        matched = tuple(matching_silences(silences, labels, self._clock()))
        self._on_result("silenced" if matched else "clear")
        return SilenceVerdict(matched)


def target_labels(signal_labels: Mapping[str, str], model: str) -> dict[str, str]:
    """The labels a silence is matched against: the signal's, with the policy's model."""
    return {**signal_labels, "model": model}


def describe_all(silences: Sequence[Silence]) -> list[str]:
    return [s.describe() for s in silences]


def silence_note(verdict: SilenceVerdict | None) -> dict[str, Any]:
    """What a decision journals in its plan about the silences: nothing when they were not asked
    (no Alertmanager, or not a detector signal), else what matched, or why none could be checked."""
    if verdict is None:
        return {}
    if verdict.silenced:
        return {"silences": {"checked": True, "matched": describe_all(verdict.matched)}}
    if verdict.error is not None:
        return {"silences": {"checked": False, "error": verdict.error,
                             "note": "acted without silences: Alertmanager did not answer"}}
    return {"silences": {"checked": True, "matched": []}}
