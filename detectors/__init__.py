"""Detectors turn metric series into detections: pure functions over arrays, no I/O."""
