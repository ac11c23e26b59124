"""Short demo runs as subprocesses, side by side (each its own servers on free ports), for the
tests that check a scenario end to end: each is stopped by its PID if it overstays its bound."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.paths import REPO


def run_demos(out: Path, scenarios: Sequence[str], bound_seconds: float) -> dict[str, dict[str, Any]]:
    """Start `python -m lab.demo --scenario <name> --short` for every name at once, wait (bounded)
    for each, and return each run's JSON summary with its log under "log"."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    try:
        for name in scenarios:
            logs[name] = out / f"{name}.log"
            with open(logs[name], "wb") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "lab.demo", "--scenario", name, "--short", "--out", str(out / name)],
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        for name, proc in procs.items():
            try:
                code = proc.wait(timeout=bound_seconds)
            except subprocess.TimeoutExpired:
                code = None
            assert code == 0, f"{name} exited {code}:\n{logs[name].read_text()[-4000:]}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()  # SIGTERM: the demo cancels its run and stops its own servers by PID
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return {name: json.loads((out / name / f"{name}.json").read_text()) | {"log": logs[name].read_text()}
            for name in scenarios}
