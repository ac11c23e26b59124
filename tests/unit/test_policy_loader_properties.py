"""The policy loader against any file content: it returns a PolicySet or raises PolicyLoadError whose
errors are one readable line each, naming the file; never another exception.

Regression tests for each hostile class (bytes that are not UTF-8, a file gone between listing and
reading, YAML aliases that expand without end, an alias cycle, deep nesting, documents that are not
mappings, values PyYAML or a validator cannot convert), then property-based tests (hypothesis) on
random text, random YAML documents and mutations of a valid policy.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies.loader as loader
from daemon.wiring.registries import action_registry, detector_registry
from policies.loader import PolicyLoadError, PolicySet, load_policies, load_policies_text
from tests.unit.test_policy_loader import GOOD

ACTIONS, DETECTORS = action_registry(), detector_registry()

# The loader tests' valid policy with a detector trigger as well, so that mutations reach the
# binding of detector params too.
GOOD_DOC = yaml.safe_load(GOOD)
GOOD_DOC["triggers"].append({"detector": {
    "type": "tail_anomaly", "interval": "15s", "params": {"min_absolute_increase": 100000},
    "query": 'max(nv_inference_request_summary_us{model="$model", quantile="0.999"})'}})
GOOD_TEXT = yaml.safe_dump(GOOD_DOC)


def _load_text(text: str, source: str = "p.yaml") -> PolicySet | PolicyLoadError:
    try:
        return load_policies_text(text, source, ACTIONS, DETECTORS)
    except PolicyLoadError as exc:
        return exc


def _load_dir(path: Path) -> PolicySet | PolicyLoadError:
    try:
        return load_policies(path, ACTIONS, DETECTORS)
    except PolicyLoadError as exc:
        return exc


def _readable(result: PolicySet | PolicyLoadError, source: str) -> None:
    """Each error is one printable line that starts with the file it is about."""
    if isinstance(result, PolicySet):
        return
    assert result.errors
    for error in result.errors:
        line = str(error)
        assert line.isprintable() and source in error.file and line.startswith(loader._printable(error.file)), line


def _error_of(text: str) -> str:
    result = _load_text(text)
    assert isinstance(result, PolicyLoadError)
    _readable(result, "p.yaml")
    return str(result)


# ---- regression: one test per class of hostile content ---------------------------------------------


def test_good_policy_still_loads():
    (policy,) = load_policies_text(GOOD_TEXT, "p.yaml", ACTIONS, DETECTORS).policies
    assert policy.name == "ranker-tail" and len(policy.detectors) == 1


@pytest.mark.parametrize(("text", "reason"), [
    ("a: " + "[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ("".join("  " * i + f"k{i}:\n" for i in range(500)), "nested deeper than 64 levels"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi")) + "name: bomb\n",
     "expands to more than 100000 values"),
    ("a: &a [*a]\n", "expands to more than 100000 values"),
    ("- just\n- a list\n", "a policy must be a mapping"),
    ("a scalar", "a policy must be a mapping"),
    (GOOD_TEXT + "---\n42\n", "p.yaml (document 2): a policy must be a mapping"),
    ("name: x\nwhen: 2024-02-30\n", "invalid YAML: day is out of range for month"),
    ("name: x\nn: " + "9" * 5000 + "\n", "invalid YAML: Exceeds the limit (4300 digits)"),
    (GOOD_TEXT.replace("cooldown: 10m", "cooldown: " + "9" * 400), "invalid value: int too large to convert to float"),
    ("name: \x00\n", "invalid YAML: unacceptable character #x0000"),
    ("a: !!python/object/apply:os.system [ls]\n", "could not determine a constructor"),
    ("? [a]\n: b\n", "found unhashable key"),
    ("name: [unclosed\n", "invalid YAML at line 2, column 1"),
], ids=["deep-flow", "deep-block", "billion-laughs", "alias-cycle", "list", "scalar", "second-document",
        "bad-date", "int-5000-digits", "duration-overflow", "nul", "python-tag", "unhashable-key", "unclosed"])
def test_hostile_yaml_is_a_policy_load_error(text: str, reason: str):
    """Each class becomes a PolicyLoadError with a one-line reason naming the file."""
    assert reason in _error_of(text)


def test_bytes_that_are_not_utf8_name_the_file_and_offset(tmp_path: Path):
    (tmp_path / "a.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "b.yaml").write_text(GOOD_TEXT)
    result = _load_dir(tmp_path)
    assert isinstance(result, PolicyLoadError)
    (error,) = result.errors
    assert str(error) == f"{tmp_path / 'a.yaml'}: not UTF-8 text (byte 0xe9 at offset 9)"


def test_file_that_vanishes_after_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A file listed but gone when read (a ConfigMap update swaps the ..data link) is an error, not
    FileNotFoundError."""
    (tmp_path / "a.yaml").write_text(GOOD_TEXT)
    listed = loader.policy_files(tmp_path)
    monkeypatch.setattr(loader, "policy_files", lambda path: [*listed, tmp_path / "gone.yaml"])
    result = _load_dir(tmp_path)
    assert isinstance(result, PolicyLoadError)
    assert [str(e) for e in result.errors] == [f"{tmp_path / 'gone.yaml'}: cannot read: No such file or directory"]


def test_directory_that_vanishes_or_cannot_be_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def gone(self: Path) -> Any:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(Path, "iterdir", gone)
    result = _load_dir(tmp_path)
    assert isinstance(result, PolicyLoadError)
    assert str(result) == f"{tmp_path}: cannot list: No such file or directory"


def test_oversized_file_and_odd_file_names(tmp_path: Path):
    """A file over 1 MiB is refused unread; a name with a newline or undecodable bytes stays one line."""
    (tmp_path / "big.yaml").write_bytes(b"# " + b"x" * loader.MAX_FILE_BYTES)
    odd = tmp_path / "odd\n\udcff.yaml"
    odd.write_text("- not a mapping\n")
    result = _load_dir(tmp_path)
    assert isinstance(result, PolicyLoadError)
    lines = str(result).splitlines()
    assert lines == [f"{tmp_path}/big.yaml: larger than 1048576 bytes",
                     f"{tmp_path}/odd\\n\\udcff.yaml: a policy must be a mapping"]


# ---- property-based -------------------------------------------------------------------------------

PROPERTIES = settings(max_examples=150, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_yaml_text = st.one_of(
    st.text(max_size=200),
    # YAML's syntax characters and tokens, joined at random
    st.lists(st.sampled_from(list("{}[]:-,&*!|>'\"#?%@` \n\tab01.~=<") + ["---\n", "...\n", "!!", "<<: ", "&a ", "*a"]),
             max_size=60).map("".join),
)
_keys = st.one_of(st.sampled_from(["name", "target", "model", "triggers", "actions", "guards", "type", "alert",
                                   "detector", "params", "cooldown", "to", "url", "<<"]), st.text(max_size=8))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                     st.sampled_from(["10m", "-1s", "1e400", "previous", "http://127.0.0.1:8000", "tail_anomaly",
                                      "triton.rollback", "notify", "\x00", "\ud800", "9" * 400]))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(_keys, inner, max_size=5)), max_leaves=20)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def mutations(doc: Any, values: st.SearchStrategy[Any], keys: st.SearchStrategy[str] | None = None,
              ) -> st.SearchStrategy[Any]:
    """`doc` (JSON-like) with one to three of its values replaced by `values` or deleted, and with
    `keys`, new keys added next to them. Shared with the webhook's property tests."""
    paths = _paths(doc)[1:]
    actions = ["replace", "delete"] + (["add"] if keys is not None else [])

    @st.composite
    def mutated(draw: st.DrawFn) -> Any:
        out = copy.deepcopy(doc)
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(paths))
            parent: Any = out
            try:
                for part in path[:-1]:
                    parent = parent[part]
                action = draw(st.sampled_from(actions))
                if action == "replace":
                    parent[path[-1]] = draw(values)
                elif action == "delete":
                    del parent[path[-1]]
                elif isinstance(parent, dict) and keys is not None:
                    parent[draw(keys)] = draw(values)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier mutation removed or replaced the path
        return out

    return mutated()


@pytest.mark.slow
@PROPERTIES
@given(_yaml_text)
def test_any_text_loads_or_fails_readably(text: str):
    _readable(_load_text(text), "p.yaml")


@pytest.mark.slow
@PROPERTIES
@given(st.one_of(_values, mutations(GOOD_DOC, _values)), st.booleans())
def test_any_yaml_document_loads_or_fails_readably(doc: Any, flow: bool):
    try:
        text = yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        return  # PyYAML cannot write it (a lone surrogate): nothing to load
    _readable(_load_text(text), "p.yaml")


@pytest.mark.slow
@PROPERTIES
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=3))
def test_any_bytes_in_a_directory_load_or_fail_readably(tmp_path: Path, contents: list[bytes]):
    folder = tmp_path / "d"
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for i, data in enumerate(contents):
        (folder / f"p{i}.yaml").write_bytes(data)
    _readable(_load_dir(folder), str(folder))
