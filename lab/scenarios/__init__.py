"""Demo scenarios, one module each, played by one runner (`runner.py`) and selected by name."""
from __future__ import annotations

from lab.scenarios.base import Scenario
from lab.scenarios.canary import HEALTHY as CANARY_HEALTHY
from lab.scenarios.canary import SCENARIO as CANARY
from lab.scenarios.canary import SHARED as CANARY_SHARED
from lab.scenarios.ramp import SCENARIO as RAMP
from lab.scenarios.tail import SCENARIO as TAIL
from lab.scenarios.tail_easy import SCENARIO as TAIL_EASY

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (TAIL, TAIL_EASY, RAMP, CANARY, CANARY_HEALTHY, CANARY_SHARED)}
"""Every scenario by its `--scenario` name; an unknown name is an error, never a fallback."""
