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
    assert [p.name for p in policies.policies] == ["ranker-tail"]


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
