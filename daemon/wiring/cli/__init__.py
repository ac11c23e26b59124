"""The `tailguard` command (`main`), by role:

- `parser`: the subcommands, their flags and the handler each dispatches to;
- `operator_verbs`: freeze, unfreeze, unpin, bad-versions (list, mark, clear), status, approve, each written once
  against the operator backend (`backend`), printed by `printers` from the `records` it returns;
- `api_backend` (the running daemon's API) and `journal_backend` (the journal on the pod itself):
  the two operator backends; `stores` opens a journal from the command line;
- `journal_commands`, `policy_commands`, `run`: the other subcommands.
"""
from daemon.wiring.cli.parser import main

__all__ = ["main"]
