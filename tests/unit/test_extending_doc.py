"""docs/extending.md's examples are code: each Python block runs, and the plugins it defines work the
way the daemon uses them (loaded by a policy, detected, planned and applied, written through a
compare-and-swap)."""
from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

from actions._compare_and_swap import Conflict
from actions.base import ActionDeps
from actions.registry import ACTIONS
from core.query import Series
from core.signal import Signal
from detectors.registry import DETECTORS
from policies.loader import load_policies_text
from tests.support.paths import REPO

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "extending.md").read_text(), re.S)


def _run(index: int) -> SimpleNamespace:
    namespace: dict = {"__name__": f"extending_example_{index}"}
    # dont_inherit: the block runs as a reader's module would, without this file's `from __future__` imports.
    exec(compile(BLOCKS[index], f"docs/extending.md block {index}", "exec", dont_inherit=True), namespace)
    return SimpleNamespace(**namespace)


def test_the_page_has_the_four_examples():
    assert len(BLOCKS) == 4
    assert "class DeploymentReplicas" in BLOCKS[2]  # run against the emulator: tests/emulator/test_extending_kube_example.py


def test_the_page_names_every_file_an_action_that_writes_to_kubernetes_touches():
    text = (REPO / "docs" / "extending.md").read_text()
    for path in ("actions/scale.py", "actions/registry.py", "actions/_kube.py", "actions/_ownership.py",
                 "helm/tailguard/templates/_helpers.tpl", "helm/tailguard/values.yaml",
                 "helm/tailguard/values.schema.json", "tests/chart/test_helm_chart.py", "lab/kube/emulator.py",
                 "tests/emulator/test_scale_action.py", "docs/helm.md", "daemon/workers/door.py"):
        assert path in text and (REPO / path).exists(), path
    for member in ("`what`", "`read()`", "`value(reading)`", "`where(reading)`", "`show(value)`",
                   "`ours(reading)`", "`refusal(reading)`", "`write(reading, wanted)`", "`Preconditions`"):
        assert member in text, member


def test_the_detector_example_fires_draws_its_line_and_loads_in_a_policy():
    ex = _run(0)
    det = ex.AboveLineDetector({"line": 500})
    quiet = det.detect(Series({}, (1.0, 2.0), (100.0, 200.0)), 2.0)
    fired = det.detect(Series({}, (1.0, 2.0, 3.0), (100.0, 600.0, 700.0)), 3.0)
    assert not quiet.fired and fired.fired and fired.episode_start == 2.0 and fired.recovery_line.level == 500
    assert det.detect(Series({}, (), ()), 1.0).reason.startswith("no data")
    with pytest.raises(ValueError):
        ex.AboveLineParams.model_validate({"line": 1, "typo": 2})
    text = ("name: p\ntarget: {model: m, triton: {endpoints: ['http://127.0.0.1:9']}}\n"
            "triggers:\n  - detector: {type: above_line, query: up, params: {line: 500}}\n"
            "actions:\n  - {type: note.write, text: hello}\n")
    (policy,) = load_policies_text(text, "p.yaml", {**ACTIONS, "note.write": _run(1).WriteNote},
                                   {**DETECTORS, "above_line": ex.AboveLineDetector}).policies
    assert policy.detectors[0].params.line == 500 and policy.actions[0].kind == "note.write"


def test_the_action_example_plans_applies_verifies_and_reverts():
    ex = _run(1)
    action = ex.WriteNote(ActionDeps())
    text = ("name: p\ntarget: {model: m, triton: {endpoints: ['http://127.0.0.1:9']}}\n"
            "triggers:\n  - alert: {name: A}\nactions:\n  - {type: note.write, text: hello}\n"
            "verify: {query: up, below: 1}\n")
    (policy,) = load_policies_text(text, "p.yaml", {**ACTIONS, "note.write": ex.WriteNote}, DETECTORS).policies
    params, target = policy.actions[0].params, policy.target
    signal = Signal.from_summary({"source": "alert", "name": "A", "labels": {}, "dedup_key": "k",
                                  "observed_at": "2026-12-01T00:00:00+00:00"})

    async def play():
        step = action.plan(target, params, await action.observe(target, params), signal)
        assert (await action.apply(step, target, params)).ok
        assert (await action.verify(step, target, params)).ok
        assert action.plan(target, params, await action.observe(target, params), signal).noop
        assert (await action.revert(step, target, params)).ok
        assert target.key not in ex.LEDGER

    asyncio.run(play())


def test_the_sink_example_writes_only_over_what_it_read():
    ex = _run(3)
    sink = ex.MemorySink(ex.MemorySinkParams(), ActionDeps())

    async def play():
        first = await sink.read()
        written = await sink.write(sink.encode(2000), first)
        assert written.ms == 2000.0
        with pytest.raises(Conflict):
            await sink.write(sink.encode(3000), first)  # someone wrote since `first`

    asyncio.run(play())
