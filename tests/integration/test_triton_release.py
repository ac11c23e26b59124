"""The rollback reads the real Triton's server metadata (issue 44): the lab's server answers `GET /v2`
as recorded in fixtures/triton_metadata/triton-2.51.0.json, and the rollback's plan and the warm plan
follow the release it names (2.51 promises a reload without loss of availability: in place)."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from actions.base import ActionDeps
from actions.triton import TritonRollback, TritonRollbackParams
from actions.triton_warm import plan_warm
from core.signal import Signal, SignalSource
from core.target import Target
from lab.triton import TritonServer, served_versions
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.integration


async def test_the_rollback_path_reads_the_real_servers_release_and_plans_by_it(triton_server: TritonServer) -> None:
    assert served_versions(triton_server, "ranker") == ["2"]
    target = Target("ranker", triton_endpoints=(triton_server.base_url,))
    action = TritonRollback(ActionDeps())
    params = TritonRollbackParams.model_validate({"keepWarm": "previous"})
    observed = await action.observe(target, params)

    recorded = json.loads((FIXTURES / "triton_metadata" / "triton-2.51.0.json").read_text())
    assert observed["replicas"][triton_server.base_url]["server"] == recorded

    signal = Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {}, datetime.now(timezone.utc), "k")
    step = action.plan(target, params, observed, signal)
    assert step.after["version"] == 1
    # v1 is not loaded: today's load, on a release that promises it keeps serving while v1 loads.
    assert step.after["replicas"] == {triton_server.base_url: {"version": 1, "from": [2], "switch": "load",
                                                               "release": "triton 2.51.0"}}
    assert "no warm switch" not in step.summary
    todo, skipped = plan_warm("ranker", observed)  # 2.51 allows a version kept warm
    assert todo[triton_server.base_url]["versions"] == [1, 2] and skipped == {}
    assert served_versions(triton_server, "ranker") == ["2"]  # read only: nothing was loaded
