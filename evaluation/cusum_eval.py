"""Stream the `value_cusum` detector's test (detectors/value_cusum.py) over every NAB series with
one parameter set and print NAB scores. Run: python -m evaluation.cusum_eval."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from detectors.value_cusum import ValueCusumParams, evaluate_value_cusum
from evaluation import streaming
from evaluation.nab_data import NabSeries, load_series, nab_dir
from evaluation.nab_score import PROFILES, CorpusScore, FileScore, score_corpus, score_file


# The one parameter set for all 17 series: the production defaults except `direction`. NAB's
# anomalies go both ways (speed and taxi demand fall), latency incidents only up, so production
# keeps `up`. min_absolute_increase stays 0: NAB files share no unit.
EVAL_PARAMS = ValueCusumParams(direction="both")


def stream_onsets(params: ValueCusumParams, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decide at every record as if it were `now`, seeing only the lookback up to it.

    Returns:
        (fired per record, onset per record): an onset is a firing cycle whose episode start
        differs from the last firing cycle's, which is what the daemon acts on after dedup.
    """

    def decide(grid: np.ndarray, rows: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray]:
        batch = evaluate_value_cusum(params, grid, rows, now)
        return batch.fired, batch.episode_start

    return streaming.stream_onsets(decide, params.lookback_seconds, values)


def evaluate(series: Sequence[NabSeries], params: ValueCusumParams, profile_name: str) -> CorpusScore:
    """Score the episode onsets of every series under one NAB profile."""
    profile = PROFILES[profile_name]
    files = [score_file(stream_onsets(params, s.values)[1], s.timestamps, s.windows, profile, s.name)
             for s in series]
    return score_corpus(files, profile)


def _totals(label: str, c: CorpusScore, low_fp: CorpusScore) -> str:
    fps = sum(f.false_positives for f in c.files)
    hits = sum(f.detected_windows for f in c.files)
    return (f"| {label} | {hits}/{c.windows} | {fps} | {c.fp_per_1000:.2f} | "
            f"{c.median_delay_points:.0f} | {c.normalized:.1f} | {low_fp.normalized:.1f} |")


def _row(f: FileScore) -> str:
    delay = f"{np.median(f.delays_points):.0f}" if f.delays_points else "-"
    return (f"| {f.name.split('/')[-1].removesuffix('.csv')} | {f.detected_windows}/{f.windows} | "
            f"{f.false_positives} | {delay} | {f.raw_score:.3f} |")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nab-dir", type=Path, default=None, help="NAB folder (default: fixtures/nab)")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    series = load_series(args.nab_dir or nab_dir())
    std = evaluate(series, EVAL_PARAMS, "standard")
    print(f"NAB dev, {len(series)} series, one parameter set: {EVAL_PARAMS.model_dump()}\n")
    print("| series | windows hit | FP | median delay (points) | raw (standard) |")
    print("|---|---|---|---|---|")
    for f in std.files:
        print(_row(f))
    up = ValueCusumParams()
    print("\n| parameter set | windows hit | FP | FP/1000 | median delay (points) | standard "
          "| reward_low_FP |")
    print("|---|---|---|---|---|---|---|")
    print(_totals("value_cusum, direction both (the NAB set)", std,
                  evaluate(series, EVAL_PARAMS, "reward_low_FP_rate")))
    print(_totals("value_cusum, production defaults (direction up)", evaluate(series, up, "standard"),
                  evaluate(series, up, "reward_low_FP_rate")))
    print(f"\nnull 0.0, perfect 100.0 ({std.windows} windows); CPU {time.process_time() - t0:.1f} s")


if __name__ == "__main__":
    main()
