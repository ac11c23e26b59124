"""The operator backend protocol: each verb run through the daemon's API (`--url`, a real daemon on
loopback) and through the local journal (`--config`, a journal file with the same rows) returns the
same records and prints the same text; refusals are one line on stderr and exit 1 either way; the
verbs only the running daemon answers (status, approve) say so on the local backend."""
from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

import pytest

from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, FOREVER
from daemon.wiring.cli import main
from daemon.wiring.cli.api_backend import ApiBackend
from daemon.wiring.cli.backend import OperatorBackend
from daemon.wiring.cli.journal_backend import JournalBackend, local_user
from daemon.wiring.cli.records import BadVersion, Cleared, CommandFailed, Frozen, Lifted, Unpinned
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import local_settings, notify_policy

OPERATOR = "operator-token-77d2f1aa"
Seed = Callable[[Journal], None]


@pytest.fixture(autouse=True)
def api_tokens_env() -> Iterator[None]:
    os.environ["TAILGUARD_API_TOKENS"] = f"- {{name: alice, token: {OPERATOR}, scopes: [read, write]}}\n"
    yield
    os.environ.pop("TAILGUARD_API_TOKENS", None)


class Both:
    """A daemon answering the API, and a journal file of its own for the local backend, seeded alike."""

    def __init__(self, tmp: Path, svc: Service) -> None:
        self.svc = svc
        self.local_journal = tmp / "local" / "journal.db"
        self.local_journal.parent.mkdir()
        Journal(self.local_journal).close()
        self.config = tmp / "local" / "config.yaml"
        # the same policies as the daemon's: the local backend refuses a target no policy names
        self.config.write_text(f"journal: {{path: {self.local_journal}}}\npolicies: {{path: {tmp / 'policies'}}}\n")
        token = tmp / "token"
        token.write_text(OPERATOR + "\n")
        self.api_flags = ["--url", f"http://127.0.0.1:{svc.port}", "--token-file", str(token)]
        self.api: OperatorBackend = ApiBackend(f"http://127.0.0.1:{svc.port}", OPERATOR, None)
        self.local: OperatorBackend = JournalBackend(self.config)

    async def seed(self, seed: Seed) -> None:
        await asyncio.to_thread(seed, self.svc.journal)
        journal = Journal(self.local_journal)
        try:
            seed(journal)
        finally:
            journal.close()


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[Both]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(notify_policy("http://127.0.0.1:9/hook"))
    async with Service(local_settings(tmp_path, policies), action_registry(), detector_registry()) as svc:
        yield Both(tmp_path, svc)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    """Exit code, the CLI's stdout and its stderr lines (the daemon in this process logs to both, each
    log line starting with its date)."""
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    out = "".join(line for line in captured.out.splitlines(keepends=True) if not line.startswith("20"))
    return code, out, [line for line in captured.err.splitlines() if not line.startswith("20")]


def _same_who(text: str) -> str:
    """Who froze, as each backend journals it: the token's name via the API, the OS user via the CLI."""
    return text.replace(f"(by {local_user()} via cli)", "(by alice via api)")


def _pins(journal: Journal) -> None:
    journal.pins.record("default/ranker", "ranker", 1, from_version=2, decision_id=3, reason="r", policy="p")
    journal.pins.record("default/other", "other", 4)


def _freezes(journal: Journal) -> None:
    journal.freezes.record(DAEMON_SCOPE, "maintenance (by alice via api)", FOREVER, by="alice", source="api")
    journal.freezes.record("default/ranker", "did not recover", time.time() + 3600, decision_id=7)


def _marks(journal: Journal) -> None:
    journal.bad_versions.mark("default/ranker", 2, "rolled back by decision 3", decision_id=3)
    journal.bad_versions.mark("default/ranker", 5, "by hand")


SAME_TEXT = [
    pytest.param(_pins, ["unpin", "ranker", "--reason", "fixed"], id="unpin-with-origin"),
    pytest.param(_pins, ["unpin", "default/other"], id="unpin-by-hand"),
    pytest.param(_freezes, ["unfreeze"], id="unfreeze-daemon"),
    pytest.param(_freezes, ["unfreeze", "ranker", "--reason", "fixed"], id="unfreeze-escalation"),
    pytest.param(_marks, ["bad-versions", "ranker", "--clear", "2"], id="bad-versions-clear"),
    pytest.param(_marks, ["bad-versions", "mark", "ranker", "3", "--reason", "slow path"], id="bad-versions-mark"),
    pytest.param(lambda j: None, ["freeze", "--reason", "maintenance"], id="freeze-daemon"),
    pytest.param(lambda j: None, ["freeze", "ranker", "--reason", "canary"], id="freeze-target"),
]


@pytest.mark.parametrize("seed,argv", SAME_TEXT)
async def test_a_verb_prints_the_same_text_through_either_backend(both: Both, seed: Seed, argv: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    await both.seed(seed)
    via_api = await asyncio.to_thread(_cli, [*argv, *both.api_flags], capsys)
    via_journal = await asyncio.to_thread(_cli, [*argv, "--config", str(both.config)], capsys)
    assert via_api[0] == via_journal[0] == 0 and via_api[2] == via_journal[2] == []
    assert via_api[1] and via_api[1] == _same_who(via_journal[1])


async def test_bad_versions_list_the_same_marks_through_either_backend(both: Both,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """One JSON line per mark, alike but for `at`: each journal's own time of marking."""
    await both.seed(_marks)
    argv = ["bad-versions", "ranker"]
    listed = []
    for flags in (both.api_flags, ["--config", str(both.config)]):
        code, out, err = await asyncio.to_thread(_cli, [*argv, *flags], capsys)
        assert code == 0 and err == []
        lines = [json.loads(line) for line in out.splitlines()]
        assert all(time.time() - 60 < line.pop("at") <= time.time() for line in lines)
        listed.append(lines)
    assert listed[0] == listed[1] == [
        {"target": "default/ranker", "version": 2, "reason": "rolled back by decision 3", "decision": 3},
        {"target": "default/ranker", "version": 5, "reason": "by hand", "decision": None}]


async def test_freeze_for_a_while_says_until_when_through_either_backend(both: Both,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["freeze", "ranker", "--reason", "canary", "--for", "30m"]
    lines = []
    for flags in (both.api_flags, ["--config", str(both.config)]):
        code, out, _ = await asyncio.to_thread(_cli, [*argv, *flags], capsys)
        assert code == 0
        until = re.search(r" until (\S+): ", out)
        assert until is not None, out
        assert 1790 < datetime.fromisoformat(until[1]).timestamp() - time.time() <= 1800
        lines.append(_same_who(out.replace(until[1], "<until>")))
    assert lines[0] == lines[1] == "frozen: default/ranker until <until>: canary (by alice via api)\n"


async def test_both_backends_return_the_same_records(both: Both) -> None:
    """The protocol itself: the same calls on the same rows, the same records (who froze aside)."""
    await both.seed(_marks)  # before the pin, which would mark version 2 itself
    await both.seed(_pins)
    await both.seed(_freezes)
    answers = []
    for backend in (both.api, both.local):
        answers.append(await asyncio.to_thread(lambda b=backend: (
            b.unpin("ranker", "fixed"), b.unfreeze("ranker", "fixed"), b.unfreeze(None, "done"),
            [replace(m, at=0.0) for m in b.bad_versions("ranker")], b.clear_bad_version("ranker", 5, "fine"),
            b.freeze(None, "hold", None))))
    api, local = answers
    assert api[:5] == local[:5] == (
        Unpinned("default/ranker", 1, 2, 3),
        [Lifted(2, "default/ranker", "did not recover", 7)],
        [Lifted(1, DAEMON_SCOPE, "maintenance (by alice via api)", None)],
        [BadVersion("default/ranker", 2, "rolled back by decision 3", 3, 0.0),
         BadVersion("default/ranker", 5, "by hand", None, 0.0)],
        Cleared("default/ranker", 5))
    assert api[5] == Frozen(DAEMON_SCOPE, "hold (by alice via api)", None)
    assert local[5] == Frozen(DAEMON_SCOPE, f"hold (by {local_user()} via cli)", None)


REFUSED = [
    pytest.param(["unpin", "ranker"], id="unpin-without-a-pin"),
    pytest.param(["unfreeze", "ranker"], id="unfreeze-nothing-frozen"),
    pytest.param(["bad-versions", "ranker", "--clear", "9"], id="clear-a-version-not-marked"),
]


@pytest.mark.parametrize("argv", REFUSED)
async def test_a_refusal_is_one_line_and_exit_1_through_either_backend(both: Both, argv: list[str],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Each backend words its refusal (the daemon's 409 reason; the journal's, naming what there is)."""
    via_api = await asyncio.to_thread(_cli, [*argv, *both.api_flags], capsys)
    via_journal = await asyncio.to_thread(_cli, [*argv, "--config", str(both.config)], capsys)
    assert via_api[:2] == via_journal[:2] == (1, "")
    assert len(via_api[2]) == len(via_journal[2]) == 1 and via_api[2][0].startswith("error: 409: ")


async def test_the_local_backend_refuses_what_only_the_daemon_answers(both: Both) -> None:
    for call, verb in ((lambda: both.local.status(), "status"), (lambda: both.local.approve(1, "x"), "approve")):
        with pytest.raises(CommandFailed) as refused:
            call()
        assert refused.value.exit_code == 1
        assert refused.value.line == f"error: {verb} asks the running daemon: give its API with --url (or TAILGUARD_URL)"
    assert (await asyncio.to_thread(both.api.status)).document["role"] == "leader"
