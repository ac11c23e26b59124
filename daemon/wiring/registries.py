"""The daemon's choice of plugins: the explicit action and detector registries."""
from __future__ import annotations

from typing import Mapping

from actions.base import Action
from detectors.base import Detector


def action_registry() -> Mapping[str, type[Action]]:
    from actions.registry import ACTIONS

    return ACTIONS


def detector_registry() -> Mapping[str, type[Detector]]:
    from detectors.registry import DETECTORS

    return DETECTORS
