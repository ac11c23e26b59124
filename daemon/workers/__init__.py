"""Long-running loops that decide and act: executor, poller, scheduler, pin reconciler."""
