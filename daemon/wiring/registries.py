"""The daemon's choice of plugins: the explicit action and detector registries."""
from __future__ import annotations

from typing import Mapping


def action_registry() -> Mapping[str, type]:
    from actions.registry import ACTIONS

    return ACTIONS


def detector_registry() -> Mapping[str, type]:
    from detectors.registry import DETECTORS

    return DETECTORS
