"""The policy texts the lab's scenarios and the tests share, written once: `ranker-tail`, which rolls a
model back on Triton when its P99.9 tail rises, and the tail_anomaly trigger that watches it.

YAML text, as an operator writes it (policies/loader.py reads it); the tests import it from here,
since the lab cannot import tests/. A scenario or test that needs another variant passes its
triggers, guards or verify block rather than pasting the policy again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "policies"
SHORT_VERIFY = {"for": "10s", "interval": "5s"}
"""What a short run (the tests) changes in an example's verify block: held 10 s, sampled every 5 s."""


def example_policy(name: str, **sections: Mapping[str, Any]) -> str:
    """examples/policies/`name` with each named top-level section updated key by key
    (``target={"triton": ...}``, ``verify=SHORT_VERIFY``): what the lab must fill in, nothing else."""
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    for key, changes in sections.items():
        doc[key] |= changes
    return yaml.safe_dump(doc, sort_keys=False)


def triton_endpoints(base_url: str, metrics_url: str | None = None) -> dict[str, Any]:
    """A policy target's `triton` block for one served Triton (metrics endpoints where it reads them)."""
    return {"endpoints": [base_url], **({"metricsEndpoints": [metrics_url]} if metrics_url else {})}

TAIL_ANOMALY_TRIGGER = """\
  - detector:
      type: tail_anomaly
      # max over versions: a new version's series has no history of its own
      query: max by (model) (nv_inference_request_summary_us{model="$model", quantile="0.999"})
      companionQuery: max by (model) (nv_inference_request_summary_us{model="$model", quantile="0.99"})
      interval: 1s
      params:
        # 250 ms, in Triton's microseconds: on a CPU-starved 2-core host a healthy model's single
        # stalled request lifts its summary P99.9 past 100 ms (CI rolled back a healthy model at 100)
        min_absolute_increase: 250000
        baseline_window_seconds: 20
        evaluation_window_seconds: 8
        min_baseline_points: 8
        max_staleness_seconds: 10
"""
"""Triton's own P99.9 summary against its P99, every second: an item of a policy's `triggers:`."""

PAGE_ALERT_TRIGGER = "  - alert: {name: TritonTailLatencyHigh, matchers: {severity: page}, actsUngoverned: true}\n"
"""The lab's Alertmanager rule (lab/scenarios/base.py), when it pages; it rolls back on its own
(`actsUngoverned`, outside any stated rate: what the tests of an alert-decided rollback exercise;
a governed alert only notifies while a detector sees the target, policies/governance.py)."""

ALERT_TRIGGER = "  - alert: {name: TritonTailLatencyHigh, actsUngoverned: true}\n"
"""The same alert, whatever its severity."""

ALERT_ONLY_VERIFY = "verify: {query: 'vector(0)', below: 1, onNotRecovered: none}\n"
"""Alert-only policies need a verify block; this one's outcome is irrelevant (no Prometheus: unknown,
and onNotRecovered none freezes nothing)."""


def verify_block(query: str, below: float, for_: str, within: str = "2m", interval: str = "1s") -> str:
    """A `verify:` block: recovered once `query` stays below `below` for `for_`, within `within`."""
    return f"""verify:
  query: '{query}'
  below: {below}
  for: {for_}
  within: {within}
  interval: {interval}
"""


def rollback_policy(triton_url: str, *, model: str = "ranker", triggers: str = PAGE_ALERT_TRIGGER,
                    to: str | None = "previous", guards: str = "cooldown: 10m",
                    verify: str = ALERT_ONLY_VERIFY, extra: str = "") -> str:
    """`<model>-tail`: on `triggers` (items of `triggers:`), roll `model` back on the Triton at
    `triton_url` (`to` a version, or the action's default when None), under `guards` (a YAML flow
    mapping's body), then `verify` (a `verify:` block, or ""); `extra` is appended (more keys)."""
    to_line = f"    to: {to}\n" if to is not None else ""
    return f"""
name: {model}-tail
target:
  model: {model}
  triton: {{endpoints: ["{triton_url}"]}}
triggers:
{triggers}actions:
  - type: triton.rollback
{to_line}guards: {{{guards}}}
{verify}{extra}"""
