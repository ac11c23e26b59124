"""The Dockerfile and its build context, read as text: no builder needed, so these run everywhere."""
from __future__ import annotations

import re
import tomllib

from tests.support.paths import REPO


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), " ".join(ln.split(None, 1)[1].split())) for ln in lines]


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile()
    return instructions[max(n for n, (i, _) in enumerate(instructions) if i == "FROM"):]


def test_base_is_debian_bookworm_slim_by_build_argument() -> None:
    """BASE_IMAGE defaults to Debian bookworm slim (tag, or tag plus digest), and every stage
    starts from it, so a locally assembled base can stand in for it."""
    instructions = _dockerfile()
    args = dict(a.split("=", 1) for i, a in instructions if i == "ARG" and "=" in a)
    assert re.fullmatch(r"docker\.io/library/debian:bookworm(-\d{8})?-slim(@sha256:[0-9a-f]{64})?",
                        args["BASE_IMAGE"])
    froms = [a.split()[0] for i, a in instructions if i == "FROM"]
    assert froms[0] == "${BASE_IMAGE}"
    assert set(froms[1:]) == {"python"}  # build and runtime share the stage with Debian's python3


def test_final_stage_runs_as_numeric_non_root_user() -> None:
    """The runtime stage's USER is numeric 10001:10001 and its entrypoint the tailguard command."""
    final = _final_stage()
    assert [a for i, a in final if i == "USER"] == ["10001:10001"]
    assert ("ENTRYPOINT", '["tailguard"]') in final
    assert ("VOLUME", '["/var/lib/tailguard"]') in final


def test_every_package_pip_installs_is_copied_and_allowed_by_the_ignore_file() -> None:
    """Each package in pyproject's setuptools include, and each license file, is copied and
    allowed by .dockerignore."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {a.split()[0] for i, a in _dockerfile() if i == "COPY" and "--from" not in a}
    allowed = {ln[1:].rstrip("/") for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.startswith("!")}
    assert packages <= copied and packages <= allowed
    # setuptools refuses to build when a declared license file is missing from the context
    licenses = set(pyproject["project"]["license-files"])
    assert licenses and licenses <= copied and licenses <= allowed


def test_only_runtime_dependencies_are_installed() -> None:
    """The venv gets pyproject's [project] dependencies (never the [test] extra) and then the
    project itself without dependencies, checked by pip check."""
    runs = [a for i, a in _dockerfile() if i == "RUN"]
    assert any('["project"]["dependencies"]' in r and "pip install -r /tmp/requirements.txt" in r for r in runs)
    assert any("pip install --no-deps --no-build-isolation ." in r and "pip check" in r for r in runs)
    assert not any("[test]" in r or ".[" in r for r in runs)
