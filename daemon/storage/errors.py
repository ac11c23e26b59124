"""The journal's errors: what a caller may acknowledge, retry or give up on."""
from __future__ import annotations


class JournalError(Exception):
    """The journal could not be written; callers must not acknowledge what they could not record."""


class JournalValueError(JournalError):
    """A value cannot be stored (text with a lone surrogate): the same value will fail again."""


class JournalFenced(JournalError):
    """A write of the acting path from a replica whose term another replica has since taken (it
    lost the Lease, maybe without noticing yet): refused, so two replicas never act on one signal."""


class JournalBackpressure(JournalError):
    """Too many signals are pending: the caller should come back later (HTTP 503 + Retry-After)
    instead of the backlog growing without bound."""
