"""A Kubernetes API emulator served over real HTTP, for tests that drive the real kubernetes_asyncio client."""
