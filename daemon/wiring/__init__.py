"""Wiring: settings -> running parts, the service that runs them, the CLI and `simulate`."""
