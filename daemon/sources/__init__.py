"""Clients of the systems the daemon reads signals and values from (Prometheus)."""
