"""The `tailguard` command's own parts, without a daemon: every subcommand dispatches to a handler,
each operator verb's printer (the one text both backends' records become), and the local backend's
answers on a journal file, refusals included."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Iterator

import pytest

from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, FOREVER
from daemon.wiring.cli import main, printers
from daemon.wiring.cli.journal_backend import JournalBackend
from daemon.wiring.cli.parser import build_parser
from daemon.wiring.cli.records import (Approved, BadVersion, Cleared, CommandFailed, Frozen, Lifted, Marked,
                                       Status, Unpinned)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_subcommand_has_a_handler() -> None:
    commands = _subcommands(build_parser())
    assert set(commands) == {"run", "validate", "simulate", "schema", "journal", "journal-migrate", "status",
                             "freeze", "approve", "unfreeze", "unpin", "bad-versions", "bad-versions-mark",
                             "backtest"}
    for name, sub in commands.items():
        assert callable(sub.get_default("handler")), name


def test_operator_verbs_choose_the_api_only_with_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """status and approve default to the local daemon's URL; the others to the journal (no URL)."""
    monkeypatch.delenv("TAILGUARD_URL", raising=False)
    parser = build_parser()
    assert parser.parse_args(["status"]).url == "http://127.0.0.1:8080"
    assert parser.parse_args(["approve", "3"]).url == "http://127.0.0.1:8080"
    for argv in (["freeze", "--reason", "x"], ["unfreeze"], ["unpin", "m"], ["bad-versions", "m"],
                 ["bad-versions-mark", "m", "3", "--reason", "x"]):
        assert parser.parse_args(argv).url is None, argv


def test_printers_say_each_answer_one_way() -> None:
    assert printers.frozen(Frozen(DAEMON_SCOPE, "hold (by alice via api)", None)) == \
        "frozen: the daemon: hold (by alice via api)"
    assert printers.frozen(Frozen("default/ranker", "canary (by bob via cli)", "2026-11-29T18:00:00+00:00")) == \
        "frozen: default/ranker until 2026-11-29T18:00:00+00:00: canary (by bob via cli)"
    assert printers.unfrozen(Lifted(1, DAEMON_SCOPE, "hold", None)) == "unfrozen: the daemon (freeze 1: hold)"
    assert printers.unfrozen(Lifted(4, "default/ranker", "did not recover", 7)) == \
        "unfrozen: default/ranker (freeze 4 of decision 7: did not recover)"
    assert printers.unpinned(Unpinned("default/ranker", 1, 2, 3)) == \
        "unpinned: default/ranker (was pinned to version 1 from 2 by decision 3)"
    assert printers.unpinned(Unpinned("default/other", 4, None, None)) == "unpinned: default/other (was pinned to version 4)"
    assert printers.bad_version(BadVersion("default/ranker", 2, "rolled back", None, 1.5)) == \
        '{"target": "default/ranker", "version": 2, "reason": "rolled back", "decision": null, "at": 1.5}'
    assert printers.cleared(Cleared("default/ranker", 2)) == "cleared: version 2 of default/ranker"
    assert printers.marked(Marked("default/ranker", 3, "slow path (by alice via api)")) == \
        "marked bad: version 3 of default/ranker: slow path (by alice via api)"
    assert printers.approved(Approved("approval 1 approved by alice")) == "approval 1 approved by alice"
    assert printers.status(Status({"a": 1}), as_json=True) == '{\n  "a": 1\n}\n'


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[JournalBackend, Journal]]:
    """The local backend, and the journal it works on, open for the test to fill (closed after it)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"journal: {{path: {tmp_path / 'j.db'}}}\n")
    journal = Journal(tmp_path / "j.db")
    try:
        yield JournalBackend(config), journal
    finally:
        journal.close()


def test_the_local_backend_answers_from_the_journal(local: tuple[JournalBackend, Journal]) -> None:
    backend, journal = local
    journal.pins.record("default/ranker", "ranker", 1, from_version=2, decision_id=3, reason="r", policy="p")
    journal.freezes.record("default/ranker", "did not recover", time.time() + 3600, decision_id=7)
    assert backend.unpin("ranker", "fixed") == Unpinned("default/ranker", 1, 2, 3)
    (mark,) = backend.bad_versions("ranker")  # the pin's rollback marked the version it left
    assert (mark.target, mark.version, mark.decision) == ("default/ranker", 2, 3)
    assert backend.clear_bad_version("ranker", 2, "fine") == Cleared("default/ranker", 2)
    assert backend.unfreeze("ranker", "ok") == [Lifted(1, "default/ranker", "did not recover", 7)]
    frozen = backend.freeze(None, "hold", 600)
    assert frozen.scope == DAEMON_SCOPE and frozen.until is not None and frozen.reason.startswith("hold (by ")


def test_the_local_backend_refuses_in_one_line(local: tuple[JournalBackend, Journal]) -> None:
    backend, journal = local
    journal.freezes.record("default/held", "ConfigMap ns/cm key freezeTargets set by k: x", FOREVER, source="configmap")
    journal.pins.record("default/other", "other", 4)
    refusals = [(lambda: backend.unpin("ranker", "x"), "no pin on default/ranker (pinned now: default/other)"),
                (lambda: backend.unfreeze("ranker", "x"), "no freeze in force on default/ranker (frozen now: default/held)"),
                (lambda: backend.unfreeze("held", "x"), "default/held is frozen by the control ConfigMap "
                                                        "(ConfigMap ns/cm key freezeTargets set by k: x); clear it there"),
                (lambda: backend.clear_bad_version("ranker", 9, "x"), "version 9 of default/ranker is not marked bad")]
    for call, line in refusals:
        with pytest.raises(CommandFailed) as refused:
            call()
        assert (refused.value.line, refused.value.exit_code) == (line, 1)


RANKER_POLICY = """
name: ranker-tail
target: {model: ranker, triton: {endpoints: ["http://127.0.0.1:9"]}}
triggers: [{alert: {name: TritonTailLatencyHigh}}]
actions: [{type: triton.rollback, to: previous}]
verify: {query: 'max(nv_inference_request_summary_us{model="$model", quantile="0.999"})', below: 500000}
"""


def test_the_local_backend_refuses_an_unknown_scope_and_stores_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#42 bad input, `tailguard freeze` / `bad-versions mark` on the pod itself: a target no policy
    names, one that is not namespace/model, or policies that do not load is a one-line error (exit 2)
    and nothing is journaled; a named target and the whole daemon still freeze."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "ranker.yaml").write_text(RANKER_POLICY)
    config = tmp_path / "config.yaml"
    config.write_text(f"journal: {{path: {tmp_path / 'j.db'}}}\npolicies: {{path: {tmp_path / 'policies'}}}\n")
    Journal(tmp_path / "j.db").close()
    cases = [(["freeze", "ranker-typo", "--reason", "x"], "error: target: no policy names default/ranker-typo "
                                                          "(known: default/ranker)"),
             (["freeze", "bad//y", "--reason", "x"], "error: target: target 'bad//y' is not namespace/model"),
             (["bad-versions", "mark", "serving/other", "3", "--reason", "x"],
              "error: target: no policy names serving/other (known: default/ranker)")]
    for argv, line in cases:
        assert main([*argv, "--config", str(config)]) == 2, argv
        assert capsys.readouterr().err == line + "\n"
    (tmp_path / "policies" / "ranker.yaml").write_text("name: [broken")
    assert main(["freeze", "ranker", "--reason", "x", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read the policies to check the target: ")
    journal = Journal(tmp_path / "j.db")
    try:
        assert journal.freezes.all() == [] and journal.bad_versions.of("serving/other") == []
    finally:
        journal.close()
    (tmp_path / "policies" / "ranker.yaml").write_text(RANKER_POLICY)
    assert main(["freeze", "ranker", "--reason", "canary", "--config", str(config)]) == 0
    assert main(["freeze", "--reason", "hold", "--config", str(config)]) == 0  # the daemon needs no policy
    assert main(["bad-versions", "mark", "ranker", "3", "--reason", "slow", "--config", str(config)]) == 0


def test_a_failed_command_is_one_line_on_stderr_and_its_exit_code(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("journal: {nope: 1}\n")
    assert main(["unpin", "ranker", "--config", str(bad)]) == 2  # bad settings
    assert capsys.readouterr().err.startswith(f"error: {bad}: journal.nope")
    good = tmp_path / "good.yaml"
    good.write_text(f"journal: {{path: {tmp_path / 'missing.db'}}}\n")
    assert main(["unpin", "ranker", "--config", str(good)]) == 1
    assert capsys.readouterr().err == f"error: no journal at {tmp_path / 'missing.db'}\n"
    assert main(["freeze", "--reason", "x", "--for", "soon", "--config", str(bad)]) == 2  # --for first
    assert capsys.readouterr().err.startswith("error: --for: invalid duration 'soon'")
    assert main(["status", "--url", ""]) == 1
    assert capsys.readouterr().err == \
        "error: status asks the running daemon: give its API with --url (or TAILGUARD_URL)\n"
