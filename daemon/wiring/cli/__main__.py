"""`python -m daemon.wiring.cli`: the `tailguard` command."""
from daemon.wiring.cli.parser import main

raise SystemExit(main())
