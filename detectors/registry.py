"""The explicit list of detectors: trigger `type:` -> class. An unknown type is a load error."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

DETECTORS: Mapping[str, type] = MappingProxyType({})
