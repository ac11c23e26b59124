"""The guard that keeps the quick unit run free of processes (tests/support/spawn_guard.py), run on
small test files in pytester's in-process session. No process is started: each inner test refuses
the start right below the call the guard watches, so only the attempt is seen."""
from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = '''
import contextlib
import subprocess

import pytest


def refuse(*args, **kwargs):
    raise OSError("refused: this test starts no process")


@contextlib.contextmanager
def refused():
    """Process starts fail right below subprocess.Popen.__init__, where the guard looks."""
    original = subprocess.Popen._execute_child
    subprocess.Popen._execute_child = refuse
    try:
        with pytest.raises(OSError):
            yield
    finally:
        subprocess.Popen._execute_child = original


def spawn_true():
    with refused():
        subprocess.run(["true"])
'''
INI = ("[pytest]\nasyncio_default_fixture_loop_scope = function\n"
       "markers =\n    integration: starts processes\n    slow: slow\n")


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    return pytester


def run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", "tests.support.spawn_guard", "-p", "no:cacheprovider")


def test_an_unmarked_test_that_spawns_true_fails_and_a_marked_one_passes(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_spawn='''
import pytest
from conftest import spawn_true


def test_unmarked():
    spawn_true()


@pytest.mark.integration
def test_integration():
    spawn_true()


@pytest.mark.slow
def test_slow():
    spawn_true()


def test_pure():
    assert True
''')
    result = run(inner)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*test_spawn.py::test_unmarked started a process in its call but is not marked "
                                 "integration or slow*subprocess.Popen *'true'*"])


def test_a_module_mark_and_a_parameter_mark_count(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_marked_module='''
import pytest
from conftest import spawn_true

pytestmark = pytest.mark.integration


def test_spawns():
    spawn_true()
''', test_params='''
import pytest
from conftest import spawn_true


@pytest.mark.parametrize("spawn", [False, pytest.param(True, marks=pytest.mark.integration)])
def test_case(spawn):
    if spawn:
        spawn_true()
''')
    run(inner).assert_outcomes(passed=3)


def test_asyncio_and_multiprocessing_starts_are_seen(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_other_ways='''
import asyncio
import multiprocessing

import pytest
from conftest import refuse, refused


def test_asyncio_exec():
    async def main():
        with refused():
            await asyncio.create_subprocess_exec("true")
    asyncio.run(main())


def test_multiprocessing():
    process = multiprocessing.get_context("spawn").Process(target=print)
    process._Popen = refuse  # no process: the start is refused where it would begin
    with pytest.raises(OSError):
        process.start()
''')
    result = run(inner)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*test_asyncio_exec started a process*asyncio.create_subprocess_exec *'true'*",
                                 "*test_multiprocessing started a process*multiprocessing process*"])


def test_a_session_fixture_started_for_an_unmarked_test_fails_that_test(inner: pytest.Pytester) -> None:
    """Wider-scoped fixtures start in the setup of the first test that asks for them: that test is
    the one blamed (a marked test after it reuses the server and passes)."""
    inner.makepyfile(test_server='''
import pytest
from conftest import spawn_true


@pytest.fixture(scope="session")
def server():
    spawn_true()
    return "server"


def test_first_unmarked(server):
    assert server == "server"


@pytest.mark.integration
def test_then_marked(server):
    assert server == "server"
''')
    result = run(inner)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_first_unmarked started a process in its setup but is not marked*"])
