"""The journal: the system of record for signals, decisions, steps, pins and guard history.

journal.py      the Journal: its core with one repository per table, and pruning
core.py         transactions, reads, fencing, the text checks and the payload codec; the repositories
                use only its public face (write, fenced_write, read, sql, hold, opening, exclusive, joined)
blocking.py     the async face: `@blocking` methods are awaited with `.in_thread(...)`
records.py      the record types (named fields) and constants of the rows
errors.py       JournalError and its kinds
signals.py, decisions.py, freezes.py, approvals.py, evaluations.py, pins.py, bad_versions.py,
terms.py, shard_terms.py, effects.py, starts.py
                one repository per table (decisions.py with the steps, pins.py with pin_history),
                independent of each other (an import-linter contract in pyproject.toml)
cross_table.py  what one repository writes or reads of another's table, inside its transaction
cluster_merge.py  what the cluster state shares, and the merge of what another leader shared
group_commit.py the signal intake's group commit (one writer thread, one transaction per group)
backend.py, factory.py, sqlite_backend.py, postgres_backend.py  the databases behind it
copy.py, journal_notices.py  `tailguard journal migrate`; wake-ups on a shared journal
"""
