"""structlog setup: JSON lines in a cluster (or when asked), readable console output on a terminal.

Everything logged goes the same way: structlog's own loggers, and the standard library's
(aiohttp, asyncio, warnings, uncaught exceptions) through structlog's ProcessorFormatter on the
root handler. In JSON format each record is one line, its exception inside it and control
characters escaped, so a client's header with a newline cannot start a line of its own.
"""
from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType

import structlog
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import RequestPayloadError
from structlog.typing import EventDict, Processor, WrappedLogger


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time (a test's capture, a supervisor's swap)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _client_faults_without_traceback(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """aiohttp logs a malformed request (bad header, body not matching its encoding) with the
    parser's traceback at error level: the fault is the client's, one warning line says it."""
    exc_info = event.get("exc_info")
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if isinstance(exc, (HttpProcessingError, RequestPayloadError)):
        del event["exc_info"]
        event["error"] = " ".join(str(exc).split())
        event["level"] = "warning"
    return event


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    logging.getLogger("tailguard").critical("uncaught exception", exc_info=(exc_type, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        thread = args.thread.name if args.thread is not None else "?"
        logging.getLogger("tailguard").critical("uncaught exception in thread %s", thread,
                                                exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def _drop_plain_stream_handlers(logger: logging.Logger) -> bool:
    """Remove our handler from an earlier call and plain stderr/stdout handlers (basicConfig, a
    library's own) that would print a second, unstructured line. Whether any was removed."""
    dropped = False
    for old in list(logger.handlers):
        plain = type(old) is logging.StreamHandler and old.stream in (sys.stderr, sys.stdout,
                                                                       sys.__stderr__, sys.__stdout__)
        if isinstance(old, _StderrHandler) or plain:
            logger.removeHandler(old)
            dropped = True
    return dropped


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # sys.stderr is looked up per logger, not bound once: whoever swaps it (a test's capture,
        # a supervisor) must not leave us writing to a closed file.
        logger_factory=lambda *args: structlog.PrintLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, _client_faults_without_traceback],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    ))
    # Library loggers below DEBUG-level settings of their own (cmdstanpy) reach the root handler
    # too: its level is the filter.
    handler.setLevel(getattr(logging, level.upper()))
    root = logging.getLogger()
    _drop_plain_stream_handlers(root)
    for other in list(logging.root.manager.loggerDict.values()):
        if isinstance(other, logging.Logger):
            # Libraries that print plain text on their own (cmdstanpy) go through the root handler.
            if _drop_plain_stream_handlers(other):
                other.propagate = True
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.captureWarnings(True)
    if use_json:
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
