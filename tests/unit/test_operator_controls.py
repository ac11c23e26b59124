"""Pure parts of the operator controls: token checks, the freeze view and the ConfigMap's changes,
the approval instructions, the status table."""
from __future__ import annotations

from daemon.common.config import ApiTokenEntry
from daemon.http.auth import TokenSet
from daemon.http.status import StatusInputs, build_status, render_table
from daemon.storage.records import DAEMON_SCOPE, FOREVER, Freeze
from daemon.workers.approvals import approval_instructions
from daemon.workers.freezes import FreezeView, configmap_changes, freeze_view, target_key
from policies.loader import PolicySet

TOKENS = TokenSet([ApiTokenEntry("ro", "r" * 20, frozenset({"read"})),
                   ApiTokenEntry("rw", "w" * 20, frozenset({"read", "write"}))])


def _freeze(n: int, target: str, until: float = FOREVER, source: str | None = "api", reason: str = "x") -> Freeze:
    return Freeze(n, target, reason, 100.0, until, None, source=source, by="alice")


def test_tokens_name_the_caller_and_refuse_anything_else() -> None:
    assert TOKENS.authenticate(f"Bearer {'w' * 20}").name == "rw"  # type: ignore[union-attr]
    assert TOKENS.authenticate(f"bearer   {'r' * 20}  ").scopes == {"read"}  # type: ignore[union-attr]
    for header in (None, "", "Bearer", f"Basic {'w' * 20}", f"Bearer {'w' * 19}", "Bearer \udcff", f"Bearer {'w' * 21}"):
        assert TOKENS.authenticate(header) is None
    anonymous = TokenSet([], allow_anonymous=True).authenticate(None)
    assert anonymous is not None and anonymous.scopes == {"read", "write"}


def test_freeze_view_takes_the_longest_freeze_per_scope() -> None:
    view = freeze_view([_freeze(1, "default/a", 500.0), _freeze(2, "default/a", 900.0), _freeze(3, DAEMON_SCOPE)],
                       config=False)
    assert view.frozen and view.daemon is not None and view.targets["default/a"].id == 2
    assert not freeze_view([], config=False).frozen and freeze_view([], config=True).frozen


def test_configmap_changes_freeze_what_it_declares_and_lift_only_its_own() -> None:
    active = [_freeze(1, DAEMON_SCOPE, source="api"),
              _freeze(2, "default/a", source=None, reason="ConfigMap ns/cm key freezeTargets set by k: x"),
              _freeze(3, "default/b", source="configmap")]
    changes = configmap_changes([(DAEMON_SCOPE, "ConfigMap ...", "kubectl-edit"), ("default/b", "ConfigMap ...", "k")],
                                active, lambda scope: f"who-{scope}")
    assert [s for s, _, _ in changes.freeze] == [DAEMON_SCOPE]  # the API's freeze is not the ConfigMap's
    assert changes.lift == (("default/a", "who-default/a"),)  # imported from a previous leader, recognised


def test_target_keys() -> None:
    assert target_key("ranker") == "default/ranker" and target_key(" serving/ranker ") == "serving/ranker"
    for bad in ("a b", "NS/x", "a/b/c", "/x", ""):
        try:
            target_key(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_approval_instructions_carry_command_and_call_without_a_token() -> None:
    how = approval_instructions(7, "https://tg.example/")
    assert how["command"].startswith("tailguard approve 7 --url https://tg.example ")
    assert "https://tg.example/api/v1/approvals/7/approve" in how["call"] and "<a token with the write scope>" in how["call"]


def test_status_table_of_an_empty_daemon() -> None:
    doc = build_status(StatusInputs(now=1000.0, replica="r", leader=False, acting=False, policies=PolicySet(),
                                    policies_loaded=True, last_reload_at=None, last_reload_error="bad.yaml: x",
                                    freezes=FreezeView(config=True)))
    table = render_table(doc)
    assert "r: follower (not acting)" in table and "errors: bad.yaml: x" in table
    assert "DAEMON FROZEN by config" in table and table.rstrip().endswith("stale queries: none")
