"""The daemon: wires intake, workers and cluster coordination around the journal.

Rooms, top to bottom (an import-linter contract keeps the order):
    wiring/   settings -> running parts (one builder), the service, CLI and `simulate`
    http/     the aiohttp app: Alertmanager webhook, health, readiness, metrics; payload parsing
    workers/  decision ladder (decide), executor, approvals, backlog, poller, scheduler, pin reconciler,
              recovery checks, notifier
    cluster/  Kubernetes client, Events, EndpointSlices, Lease election, shared state ConfigMap
    storage/  the journal
    sources/  the Prometheus query client
    common/   settings, the daemon's own metrics, logging
"""
