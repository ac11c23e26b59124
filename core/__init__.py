"""Shared vocabulary of tailguard: signals, outcomes, query results and small pure helpers.

Every other package may import `core`; `core` imports none of them.
"""
