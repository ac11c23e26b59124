"""The explicit list of actions: policy `type:` -> class. An unknown type is a load error."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from actions.base import Action
from actions.gateway import RetuneTimeout
from actions.istio import ShiftWeights
from actions.notify import Notify
from actions.scale import Scale
from actions.triton import TritonRollback

ACTIONS: Mapping[str, type[Action]] = MappingProxyType({
    TritonRollback.kind: TritonRollback,
    Notify.kind: Notify,
    ShiftWeights.kind: ShiftWeights,
    RetuneTimeout.kind: RetuneTimeout,
    Scale.kind: Scale,
})
