"""A Kubernetes API emulator served over real HTTP: a lab server like Triton and Prometheus, used by
the tests and the demo to drive the real kubernetes_asyncio client."""
