"""The sequential test behind the tail detectors: a bank of Page CUSUMs on requests above the line,
its thresholds derived from a stated false-alarm rate at the observed traffic (docs/detectors.md)."""
