"""A NAB scorer written from fixtures/nab/SCORING.md (no NAB code): scaled-sigmoid window
scoring, probationary period, null/perfect normalization, plus recall, FP rate and delay."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Profile:
    """A NAB cost profile; weights are magnitudes, as in config/profiles.json."""

    name: str
    tp_weight: float
    fp_weight: float
    fn_weight: float


STANDARD = Profile("standard", 1.0, 0.11, 1.0)
REWARD_LOW_FP = Profile("reward_low_FP_rate", 1.0, 0.22, 1.0)
REWARD_LOW_FN = Profile("reward_low_FN_rate", 1.0, 0.11, 2.0)
PROFILES = {p.name: p for p in (STANDARD, REWARD_LOW_FP, REWARD_LOW_FN)}

PROBATION_FRACTION = 0.15
PROBATION_CAP_RECORDS = 750  # 15% of 5000, NAB's default cap


def scaled_sigmoid(y: float) -> float:
    """sigma(y) = 2 / (1 + e^(5y)) - 1, flat at -1 beyond three window widths."""
    if y > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * y)) - 1.0


def probation_length(n_records: int) -> int:
    """Records at the start of a file where detections are not scored."""
    return min(int(math.floor(PROBATION_FRACTION * n_records)), PROBATION_CAP_RECORDS)


def window_indices(
    timestamps: np.ndarray, windows: Sequence[tuple[float, float]]
) -> list[tuple[int, int]]:
    """(first, last) record index of each window, both inclusive; empty windows are dropped.

    Uses a mask rather than a binary search because one NAB file has a timestamp that runs
    backwards.
    """
    ts = np.asarray(timestamps, dtype=np.float64)
    out = []
    for start, end in windows:
        idx = np.flatnonzero((ts >= start) & (ts <= end))
        if idx.size:
            out.append((int(idx[0]), int(idx[-1])))
    return sorted(out)


@dataclass(frozen=True)
class FileScore:
    name: str
    points: int  # records in the file
    scored_points: int  # records after the probationary period
    windows: int
    detected_windows: int
    true_positives: float  # summed TP weights
    false_positives: int  # count of detections outside every window
    fp_cost: float  # summed FP weights (<= 0)
    raw_score: float  # TP + FP + FN terms for the profile
    delays_points: tuple[int, ...]  # per detected window: first detection - window start
    delays_seconds: tuple[float, ...]

    @property
    def fp_per_1000(self) -> float:
        return 1000.0 * self.false_positives / self.scored_points if self.scored_points else 0.0


def score_file(
    detections: np.ndarray,
    timestamps: np.ndarray,
    windows: Sequence[tuple[float, float]],
    profile: Profile = STANDARD,
    name: str = "",
) -> FileScore:
    """Score one file's binary detections (one bool per record) against its windows.

    TP: first detection in a window earns tp * sigma(y) / sigma(-1), y = -1 at the window's
    first record and -1/W at its last. FP: fp * sigma(y), y = window widths past the end of the
    latest window before it (full cost when none precedes). FN: -fn per missed window.
    Detections in the probationary period are ignored.
    """
    det = np.asarray(detections, dtype=bool)
    ts = np.asarray(timestamps, dtype=np.float64)
    n = det.size
    probation = probation_length(n)
    wins = window_indices(ts, windows)
    first_hit: dict[int, int] = {}
    fp_count, fp_cost = 0, 0.0
    for i in np.flatnonzero(det):
        i = int(i)
        if i < probation:
            continue
        inside = next((k for k, (a, b) in enumerate(wins) if a <= i <= b), None)
        if inside is not None:
            first_hit.setdefault(inside, i)  # later detections in a window earn and cost nothing
            continue
        fp_count += 1
        before = [(a, b) for a, b in wins if b < i]
        if before:
            a, b = before[-1]
            fp_cost += profile.fp_weight * scaled_sigmoid((i - b) / (b - a + 1))
        else:
            fp_cost -= profile.fp_weight
    tp = 0.0
    delays_p, delays_s = [], []
    for k, i in sorted(first_hit.items()):
        a, b = wins[k]
        width = b - a + 1
        tp += profile.tp_weight * scaled_sigmoid(-(b - i + 1) / width) / scaled_sigmoid(-1.0)
        delays_p.append(i - a)
        delays_s.append(float(ts[i] - ts[a]))
    missed = len(wins) - len(first_hit)
    return FileScore(
        name=name, points=n, scored_points=n - probation, windows=len(wins),
        detected_windows=len(first_hit), true_positives=tp, false_positives=fp_count,
        fp_cost=fp_cost, raw_score=tp + fp_cost - profile.fn_weight * missed,
        delays_points=tuple(delays_p), delays_seconds=tuple(delays_s),
    )


def null_score(windows: int, profile: Profile = STANDARD) -> float:
    """Raw score of a detector that never fires: every window missed."""
    return -profile.fn_weight * windows


def perfect_score(windows: int, profile: Profile = STANDARD) -> float:
    """Raw score of a detector that fires on the first record of every window and nowhere else."""
    return profile.tp_weight * windows


def normalized_score(raw: float, windows: int, profile: Profile = STANDARD) -> float:
    """100 * (raw - null) / (perfect - null): perfect is 100, null is 0, noisy can be < 0."""
    lo, hi = null_score(windows, profile), perfect_score(windows, profile)
    return 100.0 * (raw - lo) / (hi - lo) if hi > lo else float("nan")


@dataclass(frozen=True)
class CorpusScore:
    profile: Profile
    files: tuple[FileScore, ...]

    @property
    def windows(self) -> int:
        return sum(f.windows for f in self.files)

    @property
    def raw_score(self) -> float:
        return sum(f.raw_score for f in self.files)

    @property
    def normalized(self) -> float:
        return normalized_score(self.raw_score, self.windows, self.profile)

    @property
    def recall(self) -> float:
        w = self.windows
        return sum(f.detected_windows for f in self.files) / w if w else float("nan")

    @property
    def fp_per_1000(self) -> float:
        pts = sum(f.scored_points for f in self.files)
        return 1000.0 * sum(f.false_positives for f in self.files) / pts if pts else 0.0

    @property
    def median_delay_points(self) -> float:
        d = [x for f in self.files for x in f.delays_points]
        return float(np.median(d)) if d else float("nan")


def score_corpus(files: Sequence[FileScore], profile: Profile = STANDARD) -> CorpusScore:
    """Totals over files; normalization uses this corpus's own window count (SCORING.md §6)."""
    return CorpusScore(profile=profile, files=tuple(files))
