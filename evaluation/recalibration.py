"""Would a second calibration stage help? Each series' probabilities re-mapped online by its own
past outcomes, scored as `evaluation.forecast_eval` scores them (measured, not built: the figures
are in docs/forecasting.md, "A second calibration stage, from the series' own outcomes").

At each step the forecaster's probability p is replaced by
``(hits + strength * p) / (count + strength)``, where count and hits are the series' earlier
decision steps whose probability fell in p's tenth and whose outcome was already known (it is
known `horizon` steps later). With no such history the probability is unchanged.

Run: ``python -m evaluation.forecast_eval --models holt --save F`` and then
``python -m evaluation.recalibration F [--strength 5,20,50]``.
"""
from __future__ import annotations

import argparse
import copy
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from evaluation import forecast_eval as fe

FLOAT = NDArray[np.float64]
MODEL = "holt"


def recalibrated(p: FLOAT, outcome: NDArray[np.bool_], decide: NDArray[np.bool_], horizon: int,
                 strength: float) -> FLOAT:
    """`p` re-mapped at each decision step by the outcomes of earlier decision steps in the same
    tenth of probability, counted only once known (`horizon` steps later). NaN stays NaN."""
    filled = np.nan_to_num(p, nan=0.0)
    tenth = np.clip(np.digitize(filled, fe.RELIABILITY_BINS) - 1, 0, fe.RELIABILITY_BINS.size - 2)
    known = decide & np.isfinite(p)
    count = np.zeros(fe.RELIABILITY_BINS.size - 1)
    hits = np.zeros_like(count)
    out = np.array(p, dtype=np.float64, copy=True)
    for t in range(p.size):
        s = t - horizon  # the last step whose outcome is known at t
        if s >= 0 and known[s]:
            count[tenth[s]] += 1.0
            hits[tenth[s]] += float(outcome[s])
        if known[t]:
            k = tenth[t]
            out[t] = (hits[k] + strength * filled[t]) / (count[k] + strength)
    return out


def summary(results: Sequence[fe.StreamResult], label: str) -> list[str]:
    rows, bss = fe.reliability(results, MODEL)
    off, judged = fe.bins_off(rows)
    sc = fe.score(results, MODEL, fe.DEFAULT_MIN_PROBABILITY)
    at = [fe.recall_at_precision(results, MODEL, target)[0] for target in (0.7, 0.8, 0.9)]
    return [f"| {label} | {off} of {judged} | {bss:.3f} | {sc.hits}/{sc.episodes} "
            f"= {fe._f(sc.precision)} | {sc.predicted}/{sc.crossings} | {sc.false_episodes} | "
            + " / ".join(f"{x:.3f}" for x in at) + " |"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a pickle written by forecast_eval --save")
    ap.add_argument("--strength", default="5,20,50", help="prior weights of the forecaster's own probability")
    args = ap.parse_args(argv)
    results: list[fe.StreamResult] = pickle.loads(args.results.read_bytes())
    if not any(MODEL in r.probability for r in results):
        print(f"{args.results}: no {MODEL} column; run forecast_eval with --models including {MODEL}", file=sys.stderr)
        return 2
    results = [r for r in results if MODEL in r.probability]
    for dataset in sorted({r.dataset for r in results}):
        base = [r for r in results if r.dataset == dataset]
        print(f"\n## {dataset}\n")
        print("| probability | bins off by > 0.1 | Brier skill | precision at 0.9 | rise crossings / series signalled "
              "| false episodes | recall at precision 0.7 / 0.8 / 0.9 |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(summary(base, "as forecast")))
        for strength in (float(s) for s in args.strength.split(",")):
            mapped = []
            for r in base:
                m = copy.copy(r)
                m.probability = {**r.probability,
                                 MODEL: recalibrated(r.probability[MODEL], r.outcome, r.decide, r.horizon, strength)}
                mapped.append(m)
            print("\n".join(summary(mapped, f"re-mapped, strength {strength:g}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
