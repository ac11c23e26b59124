"""Stream TailAnomalyDetector over every NAB series with one default parameter set and print a
NAB score table. Run: python -m evaluation.tail_eval [--nab-dir DIR]."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from detectors.tail import TailAnomalyParams, evaluate_tail_batch
from evaluation import streaming
from evaluation.nab_data import NabSeries, load_series, nab_dir
from evaluation.nab_score import PROFILES, CorpusScore, FileScore, score_corpus, score_file


# The only parameter that carries a unit; NAB files have no common unit, so it is off (0) here and
# the relative floor and robust score decide. Everything else is the detector's default.
EVAL_PARAMS = TailAnomalyParams(min_absolute_increase=0.0)


def stream_detections(params: TailAnomalyParams, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run the detector at every record as if it were `now`, seeing only records up to it.

    Returns:
        (fired per record, episode onset per record): an onset is the first firing cycle of an
        episode (new `episode_start`), which is what tailguard acts on after dedup.
    """

    def decide(grid: np.ndarray, rows: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray]:
        batch = evaluate_tail_batch(params, grid, rows, now)
        return batch.fired, batch.episode_start

    lookback = params.baseline_window_seconds + params.evaluation_window_seconds
    return streaming.stream_onsets(decide, lookback, values)


def evaluate(series: Sequence[NabSeries], params: TailAnomalyParams, profile_name: str,
             every_cycle: bool = False) -> CorpusScore:
    """Score every series; `every_cycle` counts each firing cycle as a detection, not onsets."""
    profile = PROFILES[profile_name]
    files = []
    for s in series:
        fired, onset = stream_detections(params, s.values)
        files.append(score_file(fired if every_cycle else onset, s.timestamps, s.windows,
                                profile, s.name))
    return score_corpus(files, profile)


def _row(f: FileScore) -> str:
    delay = f"{np.median(f.delays_points):.0f}" if f.delays_points else "-"
    return (f"| {f.name.split('/')[-1].removesuffix('.csv')} | {f.points} | "
            f"{f.detected_windows}/{f.windows} | {f.false_positives} | {f.fp_per_1000:.2f} | "
            f"{delay} | {f.raw_score:.3f} |")


def _totals(label: str, c: CorpusScore) -> str:
    fps = sum(f.false_positives for f in c.files)
    hits = sum(f.detected_windows for f in c.files)
    return (f"| {label} | {hits}/{c.windows} ({100 * c.recall:.0f}%) | {fps} | "
            f"{c.fp_per_1000:.2f} | {c.median_delay_points:.0f} | {c.raw_score:.2f} | "
            f"{c.normalized:.1f} |")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nab-dir", type=Path, default=None, help="NAB folder (default: fixtures/nab)")
    ap.add_argument("--profile", default="standard", choices=sorted(PROFILES))
    args = ap.parse_args(argv)
    t0 = time.process_time()
    series = load_series(args.nab_dir or nab_dir())
    main_score = evaluate(series, EVAL_PARAMS, args.profile)
    print(f"NAB {args.profile} profile, {len(series)} series, one parameter set: "
          f"{EVAL_PARAMS.model_dump()}\n")
    print("| series | points | windows hit | FP | FP/1000 | median delay (points) | raw score |")
    print("|---|---|---|---|---|---|---|")
    for f in main_score.files:
        print(_row(f))
    variants = [
        ("tail_anomaly 3-of-5, episode onsets (as tailguard acts)", main_score),
        ("same, every firing cycle counted", evaluate(series, EVAL_PARAMS, args.profile, True)),
        ("tail_anomaly 3 consecutive (3-of-3), onsets",
         evaluate(series, EVAL_PARAMS.model_copy(update={"confirm_window_points": 3}),
                  args.profile)),
    ]
    print("\n| detector | windows hit (recall) | FP | FP/1000 | median delay (points) "
          "| raw | NAB normalized |")
    print("|---|---|---|---|---|---|---|")
    for label, c in variants:
        print(_totals(label, c))
    print(f"\nnull detector: 0.0, perfect: 100.0 ({main_score.windows} windows); "
          f"CPU {time.process_time() - t0:.1f} s")


if __name__ == "__main__":
    main()
