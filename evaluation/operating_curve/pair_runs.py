"""Run the canary deciders over simulated pairs: the single-version test on the canary alone,
delay runs (seeded, one row each) and false-verdict runs (version-days, in blocks of rows)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from evaluation.operating_curve.arrivals import Steps
from evaluation.operating_curve.deciders import Tailguard
from evaluation.operating_curve.pairs import Case, PairDecider, PairSteps, Split, seeded_pair, version_days
from evaluation.operating_curve.runs import Rate

@dataclass(frozen=True)
class Single:
    """The single-version test on the canary's series alone (the operating curve's decider)."""

    tailguard: Tailguard
    label: str = "single-version"

    @property
    def name(self) -> str:
        return self.label

    def start(self, rows: int) -> "SingleRun":
        return SingleRun(self.tailguard.start(rows), self.tailguard.promise.step_seconds)


@dataclass
class SingleRun:
    run: object
    step: float
    offset: int | None = None  # the canary's first column (where the run's column 0 is)

    @property
    def alarms(self) -> NDArray[np.int64]:
        return self.run.alarms  # type: ignore[attr-defined, no-any-return]

    @property
    def first(self) -> NDArray[np.float64]:
        return self.run.first + (self.offset or 0) * self.step  # type: ignore[attr-defined, no-any-return]

    def feed(self, pair: PairSteps) -> None:
        lo = max(0, pair.canary_start - pair.column)
        if lo >= pair.cols:
            return
        if self.offset is None:
            self.offset = pair.column + lo
        c = pair.canary
        self.run.feed(Steps(c.requests[:, lo:], c.above[:, lo:], c.latency_ms[:, lo:]))  # type: ignore[attr-defined]


def pair_delays(deciders: Sequence[PairDecider], split: Split, case: Case, seeds: Sequence[int], horizon: float,
                history: float, line_ms: float, step: float = 1.0, canary_start: float = 0.0
                ) -> dict[str, NDArray[np.float64]]:
    """Seconds from the onset to each decider's first verdict, per seed (NaN: none within `horizon`;
    negative: before the onset)."""
    out: dict[str, list[float]] = {d.name: [] for d in deciders}
    for seed in seeds:
        pair = seeded_pair(seed, split, case, horizon, history, line_ms, step, canary_start)
        for d in deciders:
            run = d.start(1)
            run.feed(pair)
            out[d.name].append(float(run.first[0]))
    return {name: np.array(v) for name, v in out.items()}


def pair_false_verdicts(deciders: Sequence[PairDecider], split: Split, case: Case, days: int, history: float,
                        line_ms: float, step: float = 1.0, episode_seconds: float | None = None, seed: int = 1,
                        block: int = 500) -> dict[str, Rate]:
    """Verdicts of each decider over `days` simulated version-days (blocks of `block` rows)."""
    alarms = {d.name: 0 for d in deciders}
    for lo in range(0, days, block):
        rows = min(block, days - lo)
        rng = np.random.default_rng([seed, lo])
        runs = [d.start(rows) for d in deciders]
        for pair in version_days(rng, rows, split, case, history, line_ms, step, episode_seconds=episode_seconds):
            for run in runs:
                run.feed(pair)
        for d, run in zip(deciders, runs):
            alarms[d.name] += int(run.alarms.sum())
    return {name: Rate(n, float(days)) for name, n in alarms.items()}
