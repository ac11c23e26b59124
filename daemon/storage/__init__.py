"""The journal: the system of record for signals, decisions, steps, pins and guard history."""
