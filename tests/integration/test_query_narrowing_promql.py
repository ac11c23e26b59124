"""The narrowed selector (daemon/cluster/query_narrowing.py) evaluated by Prometheus' own engine
(`promtool test rules`, no server): it keeps exactly the series of the led models, model names with
regex and string metacharacters included, and the other matchers still hold."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from core.promql import escape_label_value
from daemon.cluster.query_narrowing import narrow_selector

pytestmark = pytest.mark.integration

MODELS = ["a.b", "axb", 'c"d', "e|f", "e", "f", "g\\h", "(x)", "x"]
LED = ["a.b", 'c"d', "e|f", "g\\h", "(x)"]


def _series(model: str, quantile: str) -> str:
    return f'lab_latency{{model="{escape_label_value(model)}", quantile="{quantile}"}}'


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_narrowed_selector_keeps_exactly_the_led_models_series(tmp_path: Path) -> None:
    expr = narrow_selector('lab_latency{quantile="0.999"}', "model", LED)
    assert expr is not None
    values = {m: float(i + 1) for i, m in enumerate(MODELS)}
    doc = {"tests": [{
        "interval": "1m",
        "input_series": [{"series": _series(m, q), "values": f"{values[m]} {values[m]}"}
                         for m in MODELS for q in ("0.99", "0.999")],
        "promql_expr_test": [{"expr": expr, "eval_time": "1m",
                              "exp_samples": [{"labels": _series(m, "0.999"), "value": values[m]} for m in LED]}],
    }]}
    (tmp_path / "narrowed.yml").write_text(yaml.safe_dump(doc))
    done = subprocess.run(["promtool", "test", "rules", "narrowed.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # and the check bites: one model too many is a failure
    doc["tests"][0]["promql_expr_test"][0]["exp_samples"].append({"labels": _series("axb", "0.999"), "value": 2.0})
    (tmp_path / "narrowed.yml").write_text(yaml.safe_dump(doc))
    done = subprocess.run(["promtool", "test", "rules", "narrowed.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
