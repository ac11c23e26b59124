"""What every room of the daemon uses: settings, its own metrics, logging."""
