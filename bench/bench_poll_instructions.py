"""Instructions per steady poll cycle, counted by valgrind (callgrind), for this checkout and, with
`--against REV`, for another commit in the same run: a cost measure that repeats exactly where
CPU seconds on a shared 2-core machine spread wider than the 15% a comparison has to show.

Each tree's own `bench/bench_poll_cycle.py` runs unchanged (10,000 series by default), twice:
first natively, to derive the detector's thresholds for the bench's traffic (kept in a pickle:
under valgrind that derivation would take most of an hour, and it is outside the measured cycles
in either case), then under `valgrind --tool=callgrind --instr-atstart=no`, where a small helper
compiled here (gcc, valgrind's own callgrind.h) switches counting on for each steady-state cycle
(`Poller.poll_group` at a `now` past the bench's NOW) and dumps the count after it. Everything the
daemon's process runs in the cycle counts (the event loop, the HTTP client's and the journal's
threads, the cyclic GC); the fake Prometheus is a child process and does not.

Run: python bench/bench_poll_instructions.py [--against 546b308] [--series N] [--histogram] [--runs K]
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
TOGGLE_C = r"""
#include <valgrind/callgrind.h>
void tg_begin(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void tg_end(void) { CALLGRIND_DUMP_STATS_AT("steady cycle"); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _inner(src: Path, cache: Path, toggle: Path | None, bench_args: list[str]) -> None:
    """In the measured process: the tree's bench, its thresholds loaded from (or saved to) `cache`,
    counting switched on around each steady cycle when `toggle` (the helper) is given."""
    os.environ["TAILGUARD_SRC"] = str(src)
    spec = importlib.util.spec_from_file_location("tree_bench", src / "bench" / "bench_poll_cycle.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)  # puts the tree first on sys.path
    from daemon.workers import poller as poller_module

    store = _threshold_store()
    if toggle is not None:
        if store is not None and cache.exists():
            store._done.update(pickle.loads(cache.read_bytes()))  # derived natively, not under valgrind
        helper = ctypes.CDLL(str(toggle))
        original = poller_module.Poller.poll_group

        async def counted(self: Any, group: Any, now: float) -> Any:
            if now <= bench.NOW:  # warm-up and first cycles: not counted
                return await original(self, group, now)
            helper.tg_begin()
            try:
                return await original(self, group, now)
            finally:
                helper.tg_end()

        setattr(poller_module.Poller, "poll_group", counted)
    sys.argv = [str(src / "bench" / "bench_poll_cycle.py"), *bench_args]
    bench.main()
    if toggle is None and store is not None:
        cache.write_bytes(pickle.dumps(dict(store._done)))


def _threshold_store() -> Any:
    try:
        from detectors.sequential.thresholds import STORE
    except ImportError:  # a tree from before the derived thresholds
        return None
    return STORE


def _compile_toggle(work: Path) -> Path:
    c = work / "toggle.c"
    c.write_text(TOGGLE_C)
    out = work / "libtoggle.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(out), str(c)], check=True)
    return out


def _steady_counts(out_dir: Path) -> list[int]:
    """Instructions (Ir) of each dump, in dump order."""
    counts = []
    for f in sorted(out_dir.glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1])):
        m = re.search(r"^totals:\s+(\d+)", f.read_text(errors="replace"), re.M)
        if m:
            counts.append(int(m.group(1)))
    return counts


def measure_tree(src: Path, work: Path, bench_args: list[str], toggle: Path) -> list[int]:
    """One tree: a native run for its thresholds, then the counted run; steady cycles' instructions."""
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "thresholds.pickle"
    env = {**os.environ, "PYTHONHASHSEED": "0", "TAILGUARD_SRC": str(src)}
    inner = [sys.executable, str(HERE), "--inner", str(src), "--cache", str(cache)]
    subprocess.run([*inner, "--", *bench_args], check=True, env=env, stdout=subprocess.DEVNULL)
    out = work / "callgrind"
    out.mkdir(exist_ok=True)
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.out",
                    *inner, "--toggle", str(toggle), "--", *bench_args],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _steady_counts(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default=None, help="another commit, measured in the same run (a git worktree)")
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--histogram", action="store_true", help="the bench's histogram traffic")
    ap.add_argument("--runs", type=int, default=1, help="counted runs per tree (alternating)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each counted run's callgrind files here (for callgrind_annotate)")
    ap.add_argument("--inner", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--toggle", type=Path, default=None, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.inner is not None:
        _inner(args.inner, args.cache, args.toggle, [a for a in rest if a != "--"])
        return
    if shutil.which("valgrind") is None or shutil.which("gcc") is None:
        sys.exit("needs valgrind and gcc (Debian packages valgrind, gcc)")
    bench_args = ["--series", str(args.series), *(["--histogram"] if args.histogram else [])]
    with tempfile.TemporaryDirectory(prefix="tg-instr-") as tmp:
        work = Path(tmp)
        toggle = _compile_toggle(work)
        trees = {"this": REPO}
        if args.against:
            other = work / "against"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), args.against],
                           check=True, capture_output=True)
            trees[args.against] = other
        counts: dict[str, list[int]] = {name: [] for name in trees}
        try:
            for run in range(args.runs):
                for name, src in trees.items():
                    got = measure_tree(src, work / f"{name}-{run}", bench_args, toggle)
                    counts[name] += got
                    if args.keep is not None:
                        shutil.copytree(work / f"{name}-{run}" / "callgrind", args.keep / f"{name}-{run}",
                                        dirs_exist_ok=True)
                    print(f"run {run + 1}, {name}: steady cycles {', '.join(f'{c:,}' for c in got)} instructions",
                          flush=True)
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "against")],
                               capture_output=True)
    print("\n| tree | steady cycles counted | min instructions | median instructions |\n|---|---|---|---|")
    for name, c in counts.items():
        print(f"| {name} | {len(c)} | {min(c):,} | {int(statistics.median(c)):,} |")
    if args.against:
        mine, theirs = counts["this"], counts[args.against]
        print(f"\nthis / {args.against}: median {statistics.median(mine) / statistics.median(theirs):.3f}x, "
              f"min {min(mine) / min(theirs):.3f}x")
    print(f"\n(python bench/bench_poll_instructions.py {' '.join(sys.argv[1:])})")


if __name__ == "__main__":
    main()
