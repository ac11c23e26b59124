"""Cluster coordination: the Kubernetes client and its edges, leader election, shared state."""
