"""The checks `make test` runs before pytest (scripts/check_module_size.py, scripts/check_duplicates.py):
each finds what it is for in planted files and lets the near misses pass. The product packages
themselves are checked by `make test` running the scripts (not here: a pytest run would fail on
another change's work in progress)."""
from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


sizes = _script("check_module_size")
dups = _script("check_duplicates")

BLOCK = """\
    total = 0
    for item in items:
        if item is None:
            continue
        total += item.weight
    if total == 0:
        raise ValueError("no weight")
    share = [item.weight / total for item in items]
    return share
"""


def _module(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def test_a_module_over_500_lines_is_named_and_one_at_500_is_not(tmp_path: Path) -> None:
    _module(tmp_path, "ok.py", "x = 1\n" * 500)
    long = _module(tmp_path, "long.py", "x = 1\n" * 500 + "y = 2")  # no final newline: still a line
    assert sizes.too_long([tmp_path]) == [(long, 501)]
    assert sizes.main([str(tmp_path)]) == 1
    assert sizes.main([str(tmp_path / "ok.py")]) == 0


def test_known_debt_may_not_grow_and_leaves_the_list_once_paid(tmp_path: Path) -> None:
    long = _module(tmp_path, "long.py", "x = 1\n" * 520)
    name = sizes._shown(long)
    assert sizes.problems(sizes.too_long([tmp_path]), {name: 520}, [long]) == []
    assert "grew to 520" in sizes.problems(sizes.too_long([tmp_path]), {name: 510}, [long])[0]
    long.write_text("x = 1\n" * 400)
    assert "remove it from OVER_LIMIT" in sizes.problems(sizes.too_long([tmp_path]), {name: 520}, [long])[0]


def test_a_copied_block_is_found_even_reindented_and_commented(tmp_path: Path) -> None:
    a = _module(tmp_path, "a.py", "def shares(items):\n" + BLOCK)
    copied = textwrap.indent(BLOCK, "    ").replace("continue", "continue  # a comment changes nothing")
    b = _module(tmp_path, "b.py", '"""Doc."""\nimport os\n\n\nclass C:\n    def split(self, items):\n'
                + '        """A docstring is not code."""\n' + copied)
    found = dups.duplicates({p: dups.logical_lines(p.read_text()) for p in (a, b)})
    assert [(c.first, c.second, c.length) for c in found] == [((a, 2), (b, 8), 9)]
    assert dups.main([str(tmp_path)]) == 1


def test_seven_shared_lines_or_a_renamed_variable_pass(tmp_path: Path) -> None:
    seven = "\n".join(BLOCK.splitlines()[:7]) + "\n"
    a = _module(tmp_path, "a.py", "def f(items):\n" + seven)
    b = _module(tmp_path, "b.py", "def g(items):\n" + seven + "    return 0\n")
    c = _module(tmp_path, "c.py", "def h(items):\n" + BLOCK.replace("total", "whole"))
    assert dups.duplicates({p: dups.logical_lines(p.read_text()) for p in (a, b, c)}) == []


def test_a_block_repeated_within_one_module_is_found(tmp_path: Path) -> None:
    a = _module(tmp_path, "a.py", "def f(items):\n" + BLOCK + "\n\ndef g(items):\n" + BLOCK)
    found = dups.duplicates({a: dups.logical_lines(a.read_text())})
    assert [(c.first, c.second) for c in found] == [((a, 2), (a, 14))]
