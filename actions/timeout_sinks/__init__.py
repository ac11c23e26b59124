"""Where a gateway's request timeout lives: one TimeoutSink protocol, one module per kind."""
