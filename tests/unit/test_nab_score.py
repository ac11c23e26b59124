"""Tests of evaluation/nab_score.py against hand-made windows and SCORING.md's published checks."""
from __future__ import annotations

import json

import numpy as np
import pytest

from evaluation.nab_data import nab_dir
from evaluation.nab_score import (
    REWARD_LOW_FN, STANDARD, normalized_score, null_score, perfect_score, probation_length,
    scaled_sigmoid, score_corpus, score_file,
)

N = 1000  # probation: 150 records
TS = np.arange(N) * 300.0
WINDOWS = [(TS[400], TS[449]), (TS[700], TS[749])]  # two 50-record windows


def detections(*idx: int) -> np.ndarray:
    d = np.zeros(N, dtype=bool)
    d[list(idx)] = True
    return d


def test_sigmoid_matches_scoring_md_values():
    """sigma(-1)=0.987, sigma(-0.5)=0.848, sigma(0)=0, sigma(0.5)=-0.848, flat -1 beyond 3."""
    assert scaled_sigmoid(-1) == pytest.approx(0.987, abs=5e-4)
    assert scaled_sigmoid(-0.5) == pytest.approx(0.848, abs=5e-4)
    assert scaled_sigmoid(0) == 0
    assert scaled_sigmoid(0.5) == pytest.approx(-0.848, abs=5e-4)
    assert scaled_sigmoid(3.5) == -1


def test_probation_is_15_percent_capped_at_750():
    """The probationary period is 15% of the file, at most 750 records."""
    assert probation_length(1000) == 150
    assert probation_length(22695) == 750


def test_perfect_detector_scores_100_and_null_0():
    """First record of every window and nothing else: raw = windows, normalized 100; none: 0."""
    perfect = score_file(detections(400, 700), TS, WINDOWS)
    assert perfect.raw_score == pytest.approx(2.0)
    assert normalized_score(perfect.raw_score, 2) == pytest.approx(100.0)
    null = score_file(detections(), TS, WINDOWS)
    assert null.raw_score == -2.0 == null_score(2)
    assert normalized_score(null.raw_score, 2) == 0.0


def test_normalization_reproduces_published_numenta_score():
    """SCORING.md: raw 46.634 over 116 windows gives numenta's 70.10 in final_results.json."""
    path = nab_dir() / "results" / "final_results.json"
    published = (json.loads(path.read_text())["numenta"]["standard"] if path.exists() else 70.10)
    assert normalized_score(46.634, 116) == pytest.approx(published, abs=0.01)


def test_only_first_detection_in_window_counts():
    """Later detections inside the same window earn and cost nothing."""
    one = score_file(detections(425), TS, WINDOWS)
    many = score_file(detections(425, 430, 449), TS, WINDOWS)
    assert many.raw_score == one.raw_score
    assert many.false_positives == 0


def test_detection_at_label_earns_sigmoid_ratio():
    """A detection mid-window (the labeled point) earns sigma(-0.5)/sigma(-1) ~ 0.859."""
    f = score_file(detections(425), TS, WINDOWS)
    expected = scaled_sigmoid(-25 / 50) / scaled_sigmoid(-1)
    assert f.true_positives == pytest.approx(expected)
    assert f.raw_score == pytest.approx(expected - 1.0)  # the second window is missed
    assert f.delays_points == (25,) and f.delays_seconds == (25 * 300.0,)


def test_false_positive_costs_depend_on_distance_after_window():
    """FP before any window costs the full 0.11; just after a window ~0; 3+ widths after 0.11."""
    before = score_file(detections(200), TS, WINDOWS)
    just_after = score_file(detections(450), TS, WINDOWS)
    far_after = score_file(detections(650), TS, WINDOWS)  # 4 widths after the first window
    assert before.fp_cost == pytest.approx(-0.11)
    assert -0.02 < just_after.fp_cost < 0
    assert far_after.fp_cost == pytest.approx(-0.11)
    assert before.false_positives == 1


def test_probationary_detections_are_ignored():
    """Detections in the first 15% are neither FP nor TP."""
    f = score_file(detections(10, 100, 149), TS, WINDOWS)
    assert f.false_positives == 0 and f.raw_score == -2.0


def test_fp_rate_per_1000_scored_points():
    """FP per 1,000 counts only points after the probationary period."""
    f = score_file(detections(200, 300, 500), TS, WINDOWS)
    assert f.false_positives == 3
    assert f.fp_per_1000 == pytest.approx(3 * 1000 / 850)


def test_corpus_totals_and_low_fn_profile():
    """Corpus normalization uses its own window count; low-FN doubles the miss cost."""
    files = [score_file(detections(400), TS, WINDOWS, REWARD_LOW_FN),
             score_file(detections(), TS, [], REWARD_LOW_FN)]
    c = score_corpus(files, REWARD_LOW_FN)
    assert c.windows == 2 and c.recall == 0.5
    assert null_score(2, REWARD_LOW_FN) == -4.0 and perfect_score(2, REWARD_LOW_FN) == 2.0
    assert c.raw_score == pytest.approx(1.0 - 2.0)
    assert c.normalized == pytest.approx(100 * (-1.0 + 4.0) / 6.0)
    assert STANDARD.fp_weight == 0.11
