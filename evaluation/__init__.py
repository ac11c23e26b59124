"""Offline evaluation of detectors on labeled data (NAB). Not imported by the daemon."""
