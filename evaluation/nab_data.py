"""Load NAB series and their labeled anomaly windows from a NAB-layout folder."""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

# The NAB development subset shipped with the repository (fixtures/nab: data, labels, MIT license).
DEFAULT_NAB_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "nab"


@dataclass(frozen=True)
class NabSeries:
    name: str  # e.g. "realAWSCloudwatch/ec2_cpu_utilization_24ae8d.csv"
    timestamps: np.ndarray  # unix seconds, float64, ascending
    values: np.ndarray  # float64
    windows: tuple[tuple[float, float], ...]  # labeled anomaly windows, unix seconds, inclusive


def nab_dir() -> Path:
    """The NAB folder in this repository (`--nab-dir` of the evaluation commands overrides it)."""
    return DEFAULT_NAB_DIR


def _parse_time(text: str) -> float:
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()


def load_series(root: Path | None = None) -> list[NabSeries]:
    """Every series that has a windows entry, sorted by name."""
    base = root or nab_dir()
    windows = json.loads((base / "labels" / "combined_windows.json").read_text())
    out = []
    for name in sorted(windows):
        path = base / "data" / name
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        ts = np.array([_parse_time(r["timestamp"]) for r in rows], dtype=np.float64)
        vals = np.array([float(r["value"]) for r in rows], dtype=np.float64)
        # One NAB file (machine_temperature) has a timestamp that runs backwards: sort here so
        # every user of the loader gets the ascending series the docstring promises.
        order = np.argsort(ts, kind="stable")
        ts, vals = ts[order], vals[order]
        wins = tuple((_parse_time(a), _parse_time(b)) for a, b in windows[name])
        out.append(NabSeries(name, ts, vals, wins))
    return out
