"""Page's CUSUM, one per member of a bank, over many series at once: the decision core of the tail
detectors and of the operating-curve benchmark.

Per step a series brings `units` (requests above the line: exact counts from a histogram, or the
latency mass above what the bulk explains, in requests' worth) and `requests`; member j adds
x = units x ln(r_j) - requests x null x (r_j - 1), the step's Poisson log-likelihood ratio (on a
per-step design, whether the step holds one: its Bernoulli ratio, step_likelihood.py), and is
clamped at zero: S_t = max(0, S_(t-1) + x_t). The bank fires when any member reaches its threshold.

No loop over steps: with X the running sum of x (from the carried statistic), Page's recursion is
S_t = X_t - min(0, min of X up to t) (Lindley's identity), and every member's X combines the same
two running sums (of units and of requests). A member's positive run began just after the last
step where X sat at its floor. An episode starts where the longest-running positive member's run
began: the next cycle, evaluating the same steps and more, finds the same start (the dedup key)
while the episode lasts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np
from numpy.typing import NDArray

from detectors.sequential.design import BankDesign
from detectors.sequential.step_likelihood import held_rises

NONE = -1  # a column index that is not there: no run, no alarm


@dataclass(frozen=True)
class BankState:
    """Where the bank stands after some columns: handed to the next call to go on with a run."""

    statistic: NDArray[np.float64]  # [K x S]
    run_start: NDArray[np.int64]  # [K x S] absolute column each member's positive run began; NONE at 0
    column: int = 0  # absolute index of the next column

    @classmethod
    def empty(cls, members: int, rows: int, column: int = 0) -> "BankState":
        return cls(np.zeros((members, rows)), np.full((members, rows), NONE, dtype=np.int64), column)

    def rows(self, index: NDArray[np.int64]) -> "BankState":
        return BankState(self.statistic[:, index], self.run_start[:, index], self.column)


@dataclass(frozen=True)
class BankRun:
    """Where each row [S] stands after the last column."""

    state: BankState
    fired: NDArray[np.bool_]  # some member at or above its threshold
    score: NDArray[np.float64]  # max over members of statistic / threshold
    leader: NDArray[np.int64]  # the member with that score
    episode_start: NDArray[np.int64]  # earliest run start among the positive members; NONE: all at 0
    scored: NDArray[np.int64]  # steps that entered the test (both numbers finite)


@dataclass(frozen=True)
class Scored:
    """[S x P] steps as the bank reads them: units and requests with the steps that are not scored
    (a NaN in either) at zero, and which steps are scored. A caller that needs them too (sums over
    the scored steps) makes them once with `scored_steps` and hands them to `run_bank`."""

    units: NDArray[np.float64]
    requests: NDArray[np.float64]
    ok: NDArray[np.bool_]


def scored_steps(units: NDArray[np.float64], requests: NDArray[np.float64]) -> Scored:
    if units.shape != requests.shape:
        raise ValueError(f"units {units.shape} and requests {requests.shape} differ")
    ok = np.isfinite(units) & np.isfinite(requests)
    return Scored(np.where(ok, units, 0.0), np.where(ok, requests, 0.0), ok)


def run_bank(design: BankDesign, units: NDArray[np.float64], requests: NDArray[np.float64],
             thresholds: NDArray[np.float64], state: BankState | None = None,
             scored: Scored | None = None) -> BankRun:
    """Run every member of `design` over [S x P] steps (a NaN in either array: the step is not
    scored) and say where each row stands after the last one.

    Args:
        thresholds: [K] or [K x S]: each member's h (per row where traffic differs).
        state: where a previous call ended (a long array run in chunks); None starts at zero.
        scored: `scored_steps(units, requests)`, when the caller has made it already.
    """
    u, n, ok = _scored(units, requests) if scored is None else (scored.units, scored.requests, scored.ok)
    h = _per_row(thresholds, design, u.shape[0])
    st = state if state is not None else BankState.empty(len(design.ratios), u.shape[0])
    final, start = _advance(design, u, n, st)
    return _verdict(BankState(final, start, st.column + u.shape[1]), h, ok)


def first_alarms(design: BankDesign, units: NDArray[np.float64], requests: NDArray[np.float64],
                 thresholds: NDArray[np.float64], state: BankState | None = None
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64], BankRun]:
    """`run_bank`, and per row the first column (absolute) where some member reached its
    threshold and the lowest such member (NONE, NONE: no alarm in these columns)."""
    u, n, ok = _scored(units, requests)
    rows, cols = u.shape
    h = _per_row(thresholds, design, rows)
    st = state if state is not None else BankState.empty(len(design.ratios), rows)
    alarm = np.full(rows, NONE, dtype=np.int64)
    member = np.full(rows, NONE, dtype=np.int64)
    final = np.empty_like(st.statistic)
    start = np.empty_like(st.run_start)
    for block, x, work in _blocks(u, n, st, design, final, start):
        hb = h[:, block]
        never = np.iinfo(np.int64).max
        best = np.full(block.stop - block.start, never, dtype=np.int64)
        best_member = np.full(best.shape, NONE, dtype=np.int64)
        for k in range(len(design.ratios)):
            xk = x(k)
            np.minimum.accumulate(xk, axis=1, out=work)
            np.minimum(work, 0.0, out=work)
            np.subtract(xk, work, out=work)  # S over the columns
            over = work >= hb[k][:, None]
            col = np.where(over.any(axis=1), np.argmax(over, axis=1), never)
            better = col < best
            best[better], best_member[better] = col[better], k
        found = best < never
        alarm[block] = np.where(found, st.column + best, NONE)
        member[block] = np.where(found, best_member, NONE)
    run = _verdict(BankState(final, start, st.column + cols), h, ok)
    return alarm, member, run


def count_alarms(design: BankDesign, units: NDArray[np.float64], requests: NDArray[np.float64],
                 thresholds: NDArray[np.float64], state: BankState | None = None
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64], BankState]:
    """Every alarm in the columns, each restarting its row at zero on the next column (a version
    rolled back after a false alarm starts a new test): per row the number of alarms and the
    first one's column (NONE: none), and the state after the last column."""
    rows, cols = units.shape
    st = state if state is not None else BankState.empty(len(design.ratios), rows)
    h = _per_row(thresholds, design, rows)
    counts = np.zeros(rows, dtype=np.int64)
    first, _, run = first_alarms(design, units, requests, h, st)
    statistic, run_start = run.state.statistic.copy(), run.state.run_start.copy()
    alarmed = first >= 0
    counts[alarmed] = 1
    # Rows that alarmed go on from zero after their alarm, one at a time (alarms are rare).
    pending = [(int(r), int(first[r]) - st.column + 1) for r in np.flatnonzero(alarmed)]
    while pending:
        row, begin = pending.pop()
        index = np.array([row])
        fresh = BankState.empty(len(design.ratios), 1, st.column + begin)
        again, _, rest = first_alarms(design, units[index, begin:], requests[index, begin:], h[:, index], fresh)
        statistic[:, row], run_start[:, row] = rest.state.statistic[:, 0], rest.state.run_start[:, 0]
        if again[0] >= 0:
            counts[row] += 1
            pending.append((row, int(again[0]) - st.column + 1))
    return counts, first, BankState(statistic, run_start, st.column + cols)


def member_increments(design: BankDesign, member: int, units: NDArray[np.float64], requests: NDArray[np.float64]
                      ) -> NDArray[np.float64]:
    """Member `member`'s increment per step of [S x P] scored steps (no NaN): a count's jumps less
    the drain, or on a per-step design the step's likelihood ratio (step_likelihood.py)."""
    drain = requests * design.drains[member]
    if design.per_step:
        return held_rises(design.null, design.ratios[member], units, requests) - drain
    return np.asarray(units * design.jumps[member] - drain, dtype=np.float64)


def page(increments: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Page's S_t = max(0, S_(t-1) + x_t) from S = 0 over every column of [S x P] increments, and
    per row the column where its current positive run began (the one after the last S == 0; 0 if
    S never touched 0): the recursion every detector's test shares (the bank runs it per member
    from running sums, the value CUSUM on robust scores)."""
    c = np.cumsum(increments, axis=1)
    s = c - np.minimum(np.minimum.accumulate(c, axis=1), 0.0)
    at_zero = s <= 0.0
    cols = s.shape[1]
    last = np.where(at_zero.any(axis=1), cols - 1 - np.argmax(at_zero[:, ::-1], axis=1), -1)
    return s, (last + 1).astype(np.int64)


def _scored(units: NDArray[np.float64], requests: NDArray[np.float64]
            ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    s = scored_steps(units, requests)
    return s.units, s.requests, s.ok


def _per_row(thresholds: NDArray[np.float64], design: BankDesign, rows: int) -> NDArray[np.float64]:
    members = len(design.ratios)
    h = np.asarray(thresholds, dtype=np.float64)
    if h.ndim == 1:
        h = h[:, None]
    if h.shape[0] != members:
        raise ValueError(f"{h.shape[0]} thresholds for {members} members")
    return np.broadcast_to(h, (members, rows))


BLOCK_ELEMENTS = 1 << 17  # rows x columns per block: a few buffers of this stay in the CPU's cache


def _blocks(u: NDArray[np.float64], n: NDArray[np.float64], st: BankState, design: BankDesign,
            final: NDArray[np.float64], start: NDArray[np.int64]
            ) -> Iterator[tuple[slice, Callable[[int], NDArray[np.float64]], NDArray[np.float64]]]:
    """Walk the rows in blocks: for each, yield (rows, X of member k, a scratch buffer) and, once
    the caller is done with the block, write each member's final statistic and run start into
    `final` and `start`. Buffers are reused block to block: freshly allocated arrays of this size
    cost more in page faults than the arithmetic on them."""
    rows, cols = u.shape
    if cols == 0:
        final[:], start[:] = st.statistic, st.run_start
        return
    height = max(1, min(rows, BLOCK_ELEMENTS // cols))
    cu, cn = np.empty((height, cols)), np.empty((height, cols))
    xs, work = np.empty((height, cols)), np.empty((height, cols))
    jumps, drains = design.jumps, design.drains
    rows_of = np.arange(height)
    for r0 in range(0, rows, height):
        block = slice(r0, min(rows, r0 + height))
        m = block.stop - block.start
        bu, bn, bx, bw = cu[:m], cn[:m], xs[:m], work[:m]
        if not design.per_step:  # a per-step member sums its own rises (member_x)
            np.cumsum(u[block], axis=1, out=bu)
        np.cumsum(n[block], axis=1, out=bn)

        begun = st.statistic[:, block]  # each member's statistic before the block's first column
        from_zero = [not begun[k].any() for k in range(len(jumps))]

        def member_x(k: int) -> NDArray[np.float64]:
            if design.per_step:  # each held step's rise depends on its requests: summed per member
                np.cumsum(held_rises(design.null, design.ratios[k], u[block], n[block]), axis=1, out=bx)
            else:
                np.multiply(bu, jumps[k], out=bx)
            np.multiply(bn, drains[k], out=bw)
            np.subtract(bx, bw, out=bx)
            if not from_zero[k]:  # a test that starts at zero (every live cycle) adds nothing
                np.add(bx, begun[k][:, None], out=bx)
            return bx

        yield block, member_x, bw
        for k in range(len(jumps)):
            x = member_x(k)
            # The last column at the floor (the global minimum), and the floor, in one pass: the
            # first minimum of the reversed row (a NaN row: NaN either way, and never below zero).
            last = cols - 1 - np.argmin(x[:, ::-1], axis=1)
            low = x[rows_of[:m], last]
            final[k, block] = x[:, -1] - np.minimum(low, 0.0)
            # X at or below zero somewhere: the run began after that column. Never: the carried run
            # goes on, or (carried at zero) began at column 0.
            carried = np.where(st.statistic[k, block] > 0.0, st.run_start[k, block], st.column)
            began = np.where(low <= 0.0, st.column + last + 1, carried)
            start[k, block] = np.where(final[k, block] > 0.0, began, NONE)


def _advance(design: BankDesign, u: NDArray[np.float64], n: NDArray[np.float64],
             st: BankState) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Each member's statistic and run start after the last column."""
    final = np.empty_like(st.statistic)
    start = np.empty_like(st.run_start)
    for _ in _blocks(u, n, st, design, final, start):
        pass
    return final, start


def _verdict(st: BankState, h: NDArray[np.float64], ok: NDArray[np.bool_]) -> BankRun:
    final, start = st.statistic, st.run_start
    rows = final.shape[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(h > 0, final / h, np.where(final > 0, np.inf, 0.0))
    leader = np.argmax(ratio, axis=0).astype(np.int64)
    score = ratio[leader, np.arange(rows)]
    positive = final > 0.0
    never = np.iinfo(np.int64).max
    episode = np.where(positive, start, never).min(axis=0) if rows else np.zeros(0, dtype=np.int64)
    episode = np.where(positive.any(axis=0), episode, NONE).astype(np.int64)
    return BankRun(st, (final >= h).any(axis=0), score, leader, episode, ok.sum(axis=1).astype(np.int64))


def without_rows(run: BankRun) -> BankRun:
    """A copy whose state is detached from the arrays of the call (safe to keep across cycles)."""
    return replace(run, state=BankState(run.state.statistic.copy(), run.state.run_start.copy(), run.state.column))
