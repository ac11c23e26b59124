"""The recovery watch: sample a decision's verify query until `policies.recovery.judge_recovery`
settles (recovered, not recovered, unknown). Reads only; the executor journals and follows up.

Live samples come from instant queries every `interval`, stamped with the executor's clock. A watch
resumed after a restart first reads what it missed back with one range query (when a range client
is given), so a restart does not turn a recovery into `unknown`.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Awaitable, Callable

import structlog

from actions.base import QueryFn
from core.query import QueryResult, Sample
from daemon.sources.prometheus import RangeResult
from policies.planning import RecoveryCheck
from policies.recovery import Recovery, RecoveryVerdict, judge_recovery

log = structlog.get_logger("tailguard.verifier")

RangeFn = Callable[[str, float, float, float], Awaitable[RangeResult]]
MIN_WAIT_SECONDS = 0.05  # never spin: the last wait before the deadline is at least this


@dataclass(frozen=True)
class Watched:
    """A settled watch: the verdict, the samples it was judged on, and the queries that failed."""

    verdict: RecoveryVerdict
    samples: list[tuple[float, float]]
    query_errors: int
    last_error: str | None = None


async def watch_recovery(check: RecoveryCheck, acted_at: float, query: QueryFn | None,
                         clock: Callable[[], float], sleep: Callable[[float], Awaitable[None]],
                         samples: list[tuple[float, float]] | None = None) -> Watched:
    """Poll `check.query` every `check.interval` from `acted_at` until the verdict is no longer pending.

    Args:
        query: Instant PromQL query; None (no Prometheus) settles at once as unknown.
        clock: Unix time; the samples are stamped with it.
        samples: Samples already known (read back after a restart).
    """
    points = list(samples or ())
    if query is None:
        verdict = RecoveryVerdict(Recovery.UNKNOWN, "no Prometheus configured: recovery cannot be checked")
        return Watched(verdict, points, 0)
    deadline = acted_at + check.condition.within_seconds
    errors, last_error = 0, None
    while True:
        if clock() <= deadline:
            result = await _query(query, check.query)
            at = clock()
            if result.error is not None:
                errors, last_error = errors + 1, result.error
                log.warning("recovery query failed", query=check.query, error=result.error)
            else:
                value = check.value(result.samples)
                if value is not None:
                    points.append((at, value))
        now = clock()
        verdict = judge_recovery(points, acted_at, now, check.condition)
        if verdict.state is not Recovery.PENDING:
            return Watched(verdict, points, errors, last_error)
        await sleep(max(min(check.interval, deadline - now), MIN_WAIT_SECONDS))


async def _query(query: QueryFn, promql: str) -> QueryResult:
    try:
        return await query(promql)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a client that raises is one failed sample, not a lost watch
        return QueryResult(promql, error=f"{type(exc).__name__}: {exc}")


async def missed_samples(check: RecoveryCheck, acted_at: float, now: float,
                         query_range: RangeFn | None) -> list[tuple[float, float]]:
    """The samples of `check` between `acted_at` and `now` read back with a range query (a resumed
    watch); empty without a range client or when the query fails."""
    end = min(now, acted_at + check.condition.within_seconds)
    if query_range is None or end <= acted_at:
        return []
    try:
        result = await query_range(check.query, acted_at, end, check.interval)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("recovery range query raised", query=check.query, error=repr(exc))
        return []
    if result.error is not None:
        log.warning("recovery range query failed", query=check.query, error=result.error)
        return []
    by_time: dict[float, list[Sample]] = {}
    for series in result.series:
        for t, v in zip(series.timestamps, series.values):
            if not math.isnan(v):
                by_time.setdefault(t, []).append(Sample(series.labels, v))
    points = []
    for t in sorted(by_time):
        value = check.value(by_time[t])
        if value is not None:
            points.append((t, value))
    return points
