"""The price of each trigger's evidence, said by `tailguard validate` and `tailguard status`: the
figures are the operating curve's (docs/detectors.md), the price follows the evidence, the traffic
and the bucket the policy names, and what the policy alone shows about its histogram is said."""
from __future__ import annotations

import math
import re

import pytest

from daemon.http.status import StatusInputs, build_status, render_table
from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.freezes import FreezeView
from detectors.tail_excess import TailExcessParams
from policies.evidence_price import CURVE, HEAVY_TAIL, LEVELS, level, policy_prices, price
from policies.loader import PolicySet, load_policies_text
from tests.support.paths import REPO

DEFECTS = {"2x": "0.20% at 600 ms", "5x": "0.50% at 900 ms"}
HEALTHY_HEAVY = "0.05% at 1500 ms"


def _section(text: str, rps: float) -> str:
    start = text.index(f"### {rps:g} req/s")
    return text[start:text.index("###", start + 4)]


def test_the_quoted_figures_are_the_operating_curves():
    """CURVE and HEAVY_TAIL quote docs/detectors.md's tables: when the curve is re-run, the price
    `validate` prints changes with it (update policies/evidence_price.py from the new tables)."""
    doc = (REPO / "docs" / "detectors.md").read_text()
    for (rps, evidence, defect), found in CURVE.items():
        row = re.search(rf"\| {re.escape(DEFECTS[defect])} \| tailguard \({evidence}\) \| (\S+) \| (\d+)% \|",
                        _section(doc, rps))
        assert row is not None, (rps, evidence, defect)
        median = math.inf if row.group(1) == "inf" else float(row.group(1))
        assert (median, found.share) == (found.median_s, int(row.group(2)) / 100), (rps, evidence, defect)
    for rps, per_day in HEAVY_TAIL.items():
        row = re.search(rf"\| {re.escape(HEALTHY_HEAVY)} \| tailguard \(counters\) \| \d+ \| ([\d.]+) \|",
                        _section(doc, rps))
        assert row is not None and round(float(row.group(1)), 2) == per_day, rps


@pytest.mark.parametrize("rps, expected", [(None, 40.0), (1.0, 4.0), (12.0, 4.0), (13.0, 40.0), (200.0, 400.0)])
def test_traffic_is_priced_at_the_nearest_measured_level(rps, expected):
    assert level(rps if rps is not None else 40.0) == expected and expected in LEVELS


def test_counters_say_what_mass_cannot_count_and_what_a_histogram_would_cost():
    p = price(TailExcessParams(line=500000), 'nv_inference_compute_infer_duration_us{model="r"}', "prometheus",
              5.0, 40.0)
    assert p.evidence.startswith("counters at 5 s steps") and "500000 us (500 ms)" in p.evidence
    assert "a 2x breach (0.2% at 1.2x the line) is found within 10 min in 16% of runs" in p.cost
    assert "alarms ~21 times a version-day" in p.cost and "not measured" in p.cost
    assert "a histogram with a bound at the line finds the 2x breach in ~204 s" in p.cost


def test_a_histogram_at_the_line_and_one_above_it():
    at = price(TailExcessParams(line=500, evidence="histogram", line_unit="ms"),
               'nv_inference_first_response_histogram_ms_bucket{model="r", le="500"}', "triton", 1.0, 4.0)
    assert "counted exactly" in at.evidence and "~28 min (median; 100% of runs within 2 h)" in at.cost
    above = price(TailExcessParams(line=500, evidence="histogram"),
                  'istio_request_duration_milliseconds_bucket{le="1000"}', "prometheus", 5.0, None)
    assert "le=1000 above the line" in above.evidence and "never found" in above.cost


POLICY = """
name: p
target: {{model: ranker, triton: {{endpoints: ["http://127.0.0.1:9"]}}}}
triggers:
  - detector:
      type: tail_excess
      source: {source}
      query: 'nv_inference_first_response_histogram_ms_bucket{{model="$model", le="{le}"}}'
      companionQuery: 'nv_inference_first_response_histogram_ms_count{{model="$model"}}'
      params: {{line: {le}, evidence: histogram}}
actions:
  - {{type: triton.rollback, to: previous}}
"""


def test_validate_prints_each_triggers_price_and_what_the_policy_shows(tmp_path, capsys):
    (tmp_path / "p.yaml").write_text(POLICY.format(source="prometheus", le="600"))
    assert main(["validate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "trigger 0 evidence: histogram, bucket at the line 600 ms" in out
    assert "note: trigger 0: le=600 is not among 100, 500, 2000, 5000 (Triton's default" in out
    assert 'note: trigger 0: Prometheus 3 stores bounds as floats (le="600.0")' in out
    assert main(["validate", str(REPO / "examples" / "policies")]) == 0
    out = capsys.readouterr().out
    assert out.count("trigger 0 evidence: histogram, bucket at the line 500 ms") == 2
    assert "trigger 0 evidence: counters at 1 s steps" in out and "16% of runs" in out


def test_status_prices_at_the_traffic_the_last_cycle_saw():
    (policy,) = load_policies_text(POLICY.format(source="triton", le="500"), "p.yaml", action_registry(),
                                   detector_registry()).policies
    seen = {("p", 0): {"detector": "tail_excess", "series": "{}", "fired": False, "reason": "no excess",
                       "score": 0.0, "assumed": {"requests_per_second": 380.0}, "at": "-"}}
    doc = build_status(StatusInputs(now=1000.0, replica="r", leader=True, acting=True,
                                    policies=PolicySet((policy,)), policies_loaded=True, last_reload_at=None,
                                    last_reload_error=None, freezes=FreezeView(config=False), detectors=seen))
    (row,) = doc["targets"][0]["policies"]
    (evidence,) = row["evidence"]
    assert evidence["trigger"] == 0 and "at 380 req/s seen, measured at 400" in evidence["cost"]
    assert "~25 s" in evidence["cost"]
    table = render_table(doc)
    assert "evidence (what each trigger's evidence costs" in table and "p trigger 0: histogram" in table
    unseen = build_status(StatusInputs(now=1000.0, replica="r", leader=True, acting=True,
                                       policies=PolicySet((policy,)), policies_loaded=True, last_reload_at=None,
                                       last_reload_error=None, freezes=FreezeView(config=False)))
    assert "40 req/s assumed" in unseen["targets"][0]["policies"][0]["evidence"][0]["cost"]
    assert policy_prices(policy, {0: None})[0][1] == policy_prices(policy)[0][1]
