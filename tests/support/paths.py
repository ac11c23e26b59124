"""Where the repository's own test data lives (fixtures/): real samples, CRD schemas, NAB subset.

Everything a test reads is in the repository; nothing outside the checkout is consulted.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
SAMPLES = FIXTURES / "samples"
SCHEMAS = FIXTURES / "schemas"
CHART_DIR = REPO / "helm" / "tailguard"
