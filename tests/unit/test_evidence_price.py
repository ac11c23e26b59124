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


def _tables(doc: str, step: float, rps: float, evidence: str) -> str:
    """The healthy and defect tables a quote is from: the full profile's section for the histogram
    and counters read as mass ("### 40 req/s", before per-step counting), the "Counters counted per
    step" subsection's paragraph for counted counters ("40 req/s:", or at 5 s steps "40 req/s at
    Prometheus' 5 s steps")."""
    if evidence != "counted":
        assert step == 1.0
        start = doc.index(f"### {rps:g} req/s")
        return doc[start:doc.index("###", start + 4)]
    sub = doc[doc.index("### Counters counted per step"):]
    sub = sub[:sub.index("\n### ", 4)]
    paragraphs = sub.split("\n\n")
    anchor = f"{rps:g} req/s:" if step == 1.0 else f"{rps:g} req/s at Prometheus' {step:g} s steps"
    (at,) = [i for i, par in enumerate(paragraphs) if par.startswith(anchor)]
    return "\n\n".join(paragraphs[at + 1:at + 3])


def _row(evidence: str) -> str:
    return "histogram" if evidence == "histogram" else "counters"


def test_the_quoted_figures_are_the_operating_curves():
    """CURVE and HEAVY_TAIL quote docs/detectors.md's tables: when the curve is re-run, the price
    `validate` prints changes with it (update policies/evidence_price.py from the new tables)."""
    doc = (REPO / "docs" / "detectors.md").read_text()
    for (step, rps, evidence, defect), found in CURVE.items():
        tables = _tables(doc, step, rps, evidence)
        row = re.search(rf"\| {re.escape(DEFECTS[defect])} \| tailguard \({_row(evidence)}\) \| (\S+) \| (\d+)% \|",
                        tables)
        assert row is not None, (step, rps, evidence, defect)
        within = re.search(r"\| detected within (\d+) s \|", tables)
        assert within is not None and float(within.group(1)) == found.within_s, (step, rps, evidence, defect)
        median = math.inf if row.group(1) == "inf" else float(row.group(1))
        assert (median, found.share) == (found.median_s, int(row.group(2)) / 100), (step, rps, evidence, defect)
    for (step, rps, evidence), per_day in HEAVY_TAIL.items():
        row = re.search(rf"\| {re.escape(HEALTHY_HEAVY)} \| tailguard \(counters\) \| \d+ \| ([\d.]+) \|",
                        _tables(doc, step, rps, evidence))
        assert row is not None and float(row.group(1)) == per_day, (step, rps, evidence)
    # Every level is priced on every evidence at 1 s steps.
    assert {(rps, ev) for (step, rps, ev, _) in CURVE if step == 1.0} == {
        (rps, ev) for rps in LEVELS for ev in ("histogram", "counted", "mass")}


@pytest.mark.parametrize("rps, expected", [(None, 40.0), (1.0, 4.0), (12.0, 4.0), (13.0, 40.0), (200.0, 400.0)])
def test_traffic_is_priced_at_the_nearest_measured_level(rps, expected):
    assert level(rps if rps is not None else 40.0) == expected and expected in LEVELS


def test_counters_are_priced_counted_where_steps_are_short_and_as_mass_where_not():
    query = 'nv_inference_compute_infer_duration_us{model="r"}'
    counted = price(TailExcessParams(line=500000), query, "triton", 1.0, 40.0)
    assert counted.evidence.startswith("counters at 1 s steps, slow requests counted per step")
    assert "500000 us (500 ms)" in counted.evidence
    assert "a 2x breach (0.2% at 1.2x the line) is found in ~222 s (median; 100% of runs within 15 min)" in counted.cost
    assert "the stated rate holds however slow the healthy tail (0.05% at 3x the line: ~0.01 alarms" in counted.cost
    assert "a histogram with a bound at the line finds the 2x breach in ~204 s" in counted.cost
    # Prometheus' 5 s steps at 40 req/s: counted (200 requests a step), the 5 s run's figures.
    five = price(TailExcessParams(line=500000), query, "prometheus", 5.0, 40.0)
    assert five.evidence.startswith("counters at 5 s steps, slow requests counted per step")
    assert "is found in ~245 s" in five.cost and "~78 s" in five.cost and "measured at" not in five.cost
    # At 4 req/s no 5 s run: the 1 s figures, said so.
    assert "measured at 1 s steps, at 5 s steps slower (not measured)" in price(
        TailExcessParams(line=500000), query, "prometheus", 5.0, 4.0).cost
    # 5 s steps at 400 req/s hold too many requests to count in: latency mass, and its price.
    mass = price(TailExcessParams(line=500000), query, "prometheus", 5.0, 400.0)
    assert "read as latency mass" in mass.evidence and "~2000 requests a step" in mass.evidence
    assert "a 2x breach (0.2% at 1.2x the line) is found in ~371 s (median; 84% of runs within 10 min)" in mass.cost
    assert "alarms ~21 times a version-day" in mass.cost and "not measured" in mass.cost
    # So at 1 s steps beyond ~630 req/s (the merge limit at the 2x member), priced at 400.
    assert "read as latency mass" in price(TailExcessParams(line=500000), query, "triton", 1.0, 700.0).evidence
    assert "counted per step" in price(TailExcessParams(line=500000), query, "triton", 1.0, 600.0).evidence


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
    assert "trigger 0 evidence: counters at 1 s steps, slow requests counted per step" in out
    assert "~222 s (median; 100% of runs within 15 min)" in out


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
