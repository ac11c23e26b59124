"""The operator verbs, each written once: freeze, unfreeze, unpin, bad-versions (and its mark), status,
approve.
Each asks the backend the flags choose (`--url`: the daemon's API; else the journal on the pod
itself) and prints the answer with its printer."""
from __future__ import annotations

import argparse
import functools
from typing import Callable

from daemon.wiring.cli import printers
from daemon.wiring.cli.api_backend import ApiBackend
from daemon.wiring.cli.backend import OperatorBackend
from daemon.wiring.cli.journal_backend import JournalBackend
from daemon.wiring.cli.records import CommandFailed

Verb = Callable[[OperatorBackend, argparse.Namespace], int]
Handler = Callable[[argparse.Namespace], int]


def backend_for(args: argparse.Namespace) -> OperatorBackend:
    """The daemon's API when `--url` is given (or its environment default), else the journal the
    settings (`--config`) name.

    Raises:
        SystemExit: a token file or CA bundle that cannot be read.
    """
    if args.url:
        return ApiBackend.from_arguments(args.url, args.token_file, args.cacert)
    return JournalBackend(getattr(args, "config", None))


def operator_verb(verb: Verb) -> Handler:
    """A subcommand handler from a verb: the backend chosen (and its flags read) first."""
    @functools.wraps(verb)
    def handler(args: argparse.Namespace) -> int:
        return verb(backend_for(args), args)
    return handler


@operator_verb
def freeze(backend: OperatorBackend, args: argparse.Namespace) -> int:
    from core.durations import parse_duration

    try:
        seconds = parse_duration(args.duration) if args.duration is not None else None
    except ValueError as exc:
        raise CommandFailed(f"error: --for: {exc}", 2) from None
    print(printers.frozen(backend.freeze(args.target, args.reason, seconds)))
    return 0


@operator_verb
def unfreeze(backend: OperatorBackend, args: argparse.Namespace) -> int:
    for lifted in backend.unfreeze(args.target, args.reason):
        print(printers.unfrozen(lifted))
    return 0


@operator_verb
def unpin(backend: OperatorBackend, args: argparse.Namespace) -> int:
    print(printers.unpinned(backend.unpin(args.target, args.reason)))
    return 0


@operator_verb
def bad_versions(backend: OperatorBackend, args: argparse.Namespace) -> int:
    if args.clear is not None:
        print(printers.cleared(backend.clear_bad_version(args.target, args.clear, args.reason)))
        return 0
    for mark in backend.bad_versions(args.target):
        print(printers.bad_version(mark))
    return 0


@operator_verb
def mark_bad_version(backend: OperatorBackend, args: argparse.Namespace) -> int:
    if args.version < 1:
        raise CommandFailed("error: VERSION must be 1 or more", 2)
    print(printers.marked(backend.mark_bad_version(args.target, args.version, args.reason)))
    return 0


@operator_verb
def status(backend: OperatorBackend, args: argparse.Namespace) -> int:
    print(printers.status(backend.status(), args.json), end="")
    return 0


@operator_verb
def approve(backend: OperatorBackend, args: argparse.Namespace) -> int:
    print(printers.approved(backend.approve(args.approval, args.reason)))
    return 0
