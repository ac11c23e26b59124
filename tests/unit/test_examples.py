"""The policies people copy from (README, docs, examples/) load in the real loader."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from daemon.wiring.registries import action_registry, detector_registry
from policies.loader import load_policies, load_policies_text
from tests.support.paths import REPO



def _yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.S)


def test_example_policy_directory_loads():
    """examples/policies validates (the demo and README point at it)."""
    policies = load_policies(REPO / "examples" / "policies", action_registry(), detector_registry())
    assert sorted(p.name for p in policies.policies) == ["ranker-canary", "ranker-capacity", "ranker-forecast",
                                                         "ranker-retune", "ranker-tail", "ranker-tail-histogram",
                                                         "ranker-tail-istio"]


def test_canary_example_policy_is_the_recommended_shape():
    """examples/policies/canary.yaml: the judge trigger, the weight shift to the stable, the breaker
    retune from the stable's P99.9 and a verify on the stable's tail."""
    text = (REPO / "examples" / "policies" / "canary.yaml").read_text()
    (policy,) = load_policies_text(text, "canary.yaml", action_registry(), detector_registry()).policies
    assert policy.name == "ranker-canary"
    assert [d.trigger.type for d in policy.detectors] == ["tail_canary"]
    assert [a.kind for a in policy.actions] == ["istio.shift_weights", "gateway.retune_timeout"]
    assert dict(policy.actions[0].params.set_weights or {})  # type: ignore[attr-defined] == {"v1": 100, "v2": 0}
    assert 'destination_version="v1"' in policy.actions[1].params.query  # type: ignore[attr-defined]
    assert policy.spec.verify is not None and 'destination_version="v1"' in policy.spec.verify.query


def test_example_rollback_keeps_production_windows():
    """The tail rollback's verify uses the documented defaults, nothing shortened."""
    policies = load_policies(REPO / "examples" / "policies", action_registry(), detector_registry())
    (tail,) = [p for p in policies.policies if p.name == "ranker-tail"]
    verify = tail.spec.verify
    assert verify is not None and (verify.hold, verify.within, verify.interval) == (60.0, 180.0, 15.0)


def test_readme_policy_example_loads():
    """The README's policy block is a valid policy."""
    (block,) = [b for b in _yaml_blocks(REPO / "README.md") if "triggers:" in b]
    (policy,) = load_policies_text(block, "README.md", action_registry(), detector_registry()).policies
    assert {a.kind for a in policy.actions} == {"triton.rollback", "istio.shift_weights"}


@pytest.mark.parametrize("doc", ["docs/helm.md"])
def test_policies_in_helm_values_examples_load(doc: str):
    """Policies inside values examples (`policies:` lists) are valid policies."""
    found = 0
    for block in _yaml_blocks(REPO / doc):
        values = yaml.safe_load(block)
        if isinstance(values, dict) and values.get("policies"):
            text = yaml.safe_dump_all(values["policies"])
            load_policies_text(text, doc, action_registry(), detector_registry())
            found += len(values["policies"])
    assert found >= 1
