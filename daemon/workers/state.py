"""The state every worker reads at decision time: the active policy set and the global freeze."""
from __future__ import annotations

from dataclasses import dataclass

from policies.loader import PolicySet


@dataclass
class ExecutorState:
    """What the executor reads at decision time; swapped by reload, leader election and the CLI."""

    policies: PolicySet
    frozen: bool = False
