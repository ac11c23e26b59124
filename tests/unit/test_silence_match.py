"""Silence matching as Alertmanager does it: =, !=, =~, !~ (anchored), missing labels read as "",
every matcher must match, only active silences count; lenient parsing of the v2 answer."""
from __future__ import annotations

import asyncio

import pytest

from daemon.workers.silences import (Matcher, Silence, SilenceChecker, matching_silences, parse_silences,
                                     silence_matches, target_labels)

LABELS = {"model": "ranker", "namespace": "serving", "version": "2"}


def _silence(*matchers: Matcher, state: str | None = "active", starts: float = 0.0, ends: float = 100.0) -> Silence:
    return Silence("s1", tuple(matchers), starts, ends, state, "alice", "node upgrades")


@pytest.mark.parametrize("matcher, hit", [
    (Matcher("model", "ranker"), True),
    (Matcher("model", "rank"), False),
    (Matcher("model", "ranker", is_equal=False), False),
    (Matcher("model", "scorer", is_equal=False), True),
    (Matcher("model", "rank.*", is_regex=True), True),
    (Matcher("model", "rank", is_regex=True), False),  # anchored: a prefix is not a match
    (Matcher("model", "ranker|scorer", is_regex=True), True),  # alternation inside the anchors
    (Matcher("model", "x|ranker", is_regex=True, is_equal=False), False),
    (Matcher("model", "score.*", is_regex=True, is_equal=False), True),
    (Matcher("team", ""), True),  # a missing label is the empty string
    (Matcher("team", "", is_equal=False), False),
    (Matcher("team", ".*", is_regex=True), True),
    (Matcher("team", ".+", is_regex=True), False),
    (Matcher("model", "(", is_regex=True), False),  # not a valid regex: matches nothing
])
def test_each_operator(matcher: Matcher, hit: bool):
    """One matcher against the target's labels, per operator."""
    assert matcher.matches(LABELS) is hit


def test_every_matcher_must_match():
    """A silence is an AND of its matchers."""
    both = _silence(Matcher("model", "ranker"), Matcher("namespace", "serving"))
    one_off = _silence(Matcher("model", "ranker"), Matcher("namespace", "default"))
    assert silence_matches(both, LABELS, 50.0)
    assert not silence_matches(one_off, LABELS, 50.0)
    assert not silence_matches(_silence(), LABELS, 50.0)  # no matchers silences nothing


def test_only_active_silences_count():
    """Alertmanager's state wins when given; without it the time window decides."""
    m = Matcher("model", "ranker")
    assert not silence_matches(_silence(m, state="expired"), LABELS, 50.0)
    assert not silence_matches(_silence(m, state="pending"), LABELS, 50.0)
    assert silence_matches(_silence(m, state=None), LABELS, 50.0)
    assert not silence_matches(_silence(m, state=None), LABELS, 100.0)
    assert not silence_matches(_silence(m, state=None, starts=60.0), LABELS, 50.0)
    assert matching_silences([_silence(m, state="expired"), _silence(m)], LABELS, 50.0)[0].state == "active"


def test_parse_v2_answer_leniently():
    """Fields as API v2 gives them; a malformed entry is skipped, not fatal; extra fields ignored."""
    doc = [
        {"id": "a1", "status": {"state": "active"}, "createdBy": "alice", "comment": "upgrade",
         "startsAt": "2026-11-29T17:00:00.000Z", "endsAt": "2026-11-29T18:00:00Z", "updatedAt": "x",
         "matchers": [{"name": "model", "value": "ranker", "isRegex": False, "isEqual": True},
                      {"name": "env", "value": "prod|stage", "isRegex": True}]},
        {"id": "broken"},
    ]
    (silence,) = parse_silences(doc)
    assert silence.id == "a1" and silence.state == "active" and silence.ends_at - silence.starts_at == 3600
    assert [str(m) for m in silence.matchers] == ['model="ranker"', 'env=~"prod|stage"']
    assert "silence a1 by alice until 2026-11-29T18:00:00+00:00" in silence.describe()
    with pytest.raises(ValueError):
        parse_silences({"error": "no"})


def test_target_labels_carry_the_policy_model():
    """The signal's labels plus the policy's model (the target's, whatever the series said)."""
    assert target_labels({"instance": "a:8002"}, "ranker") == {"instance": "a:8002", "model": "ranker"}


def test_checker_never_raises():
    """A fetch that fails is "not checked", with why; a good answer is matched."""
    results: list[str] = []

    async def down() -> object:
        raise OSError("connection refused")

    async def up() -> object:
        return [{"id": "a1", "status": {"state": "active"}, "startsAt": "2026-01-01T00:00:00Z",
                 "endsAt": "2027-01-01T00:00:00Z", "matchers": [{"name": "model", "value": "ranker"}]}]

    verdict = asyncio.run(SilenceChecker(down, on_result=results.append)({"model": "ranker"}))
    assert not verdict.silenced and "connection refused" in verdict.reason
    verdict = asyncio.run(SilenceChecker(up, on_result=results.append)({"model": "ranker"}))
    assert verdict.silenced and verdict.reason.startswith("silenced in Alertmanager: silence a1")
    assert results == ["unavailable", "silenced"]
