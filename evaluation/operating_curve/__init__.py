"""The operating curve of tail detection: tailguard's bank against the test that knows the true
rates (the limit), the naive poller and the alert rule, on simulated traffic, at one false-alarm
rate. Run by bench/bench_operating_curve.py; the definitions are in docs/detectors.md."""
