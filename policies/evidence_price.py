"""What the evidence of each `tail_excess` trigger costs, said where the operator looks (`tailguard
validate`, `tailguard status`): how long a breach near the line takes to find and what a heavy
healthy tail does, at the traffic seen (status) or assumed (validate), from the operating curve's
measured figures, and what the policy alone shows about its histogram (a bucket its exporter does
not have by default, a bound Prometheus 3 stores as a float).

The figures are docs/detectors.md's ("The operating curve" and its "Counters counted per step"),
quoted here as measured: refresh them with MEASURED_BY when those tables are re-run. Counters are
priced as the detector reads them at the traffic and step: counted per step where steps are short
enough (`counting_problem`), as latency mass where not. Pure: no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from detectors._slow_counts import counting_problem
from detectors.histogram_shape import bounds_note, convert, metric_name, metric_unit
from detectors.tail_excess import TailExcessParams, bucket_bound
from policies.loader import LoadedPolicy

MEASURED_BY = ("histogram, and counters read as mass: python bench/bench_operating_curve.py --skip-replay "
               "--traffic 4 (2026-12-03) and --traffic 40,400,diurnal (2026-12-02), re-run 2026-12-06 on 6685822, "
               "the same tables (200 seeds per defect, 3,000 version-days per healthy case); counters counted per "
               "step: python bench/bench_operating_curve.py --quick --skip-replay --skip-baselines --traffic 4, "
               "--traffic 40, --traffic 400 and --traffic 40 --step 5, 2026-12-07 on 1e38b1d (40 seeds per "
               "defect, 300 version-days per healthy case); 1 s steps unless --step, the line at 500 ms")
"""The commands that produced CURVE and HEAVY_TAIL (docs/detectors.md, "The operating curve" and its
"Counters counted per step" subsection)."""

LEVELS = (4.0, 40.0, 400.0)
"""The traffic levels measured, requests per second per version."""


@dataclass(frozen=True)
class Found:
    """One defect on one evidence at one traffic level, as the operating curve measured it."""

    median_s: float  # inf: fewer than half the seeds found it within `within_s`
    share: float  # the share of seeds that found it within `within_s`
    within_s: float


# (step seconds, req/s, evidence, defect) -> Found. Evidence: "histogram"; "counted", counters with
# slow requests counted per step (detectors/_slow_counts.py, where steps are short enough); "mass",
# counters read as latency mass (steps too long to count). "2x": 0.2% of requests at 600 ms (twice
# the P99.9 budget, 1.2x the line); "5x": 0.5% at 900 ms (the reference defect).
CURVE: dict[tuple[float, float, str, str], Found] = {
    (1.0, 4.0, "histogram", "2x"): Found(1704, 1.00, 7200), (1.0, 4.0, "histogram", "5x"): Found(334, 1.00, 7200),
    (1.0, 40.0, "histogram", "2x"): Found(204, 1.00, 600), (1.0, 40.0, "histogram", "5x"): Found(44, 1.00, 600),
    (1.0, 400.0, "histogram", "2x"): Found(25, 1.00, 600), (1.0, 400.0, "histogram", "5x"): Found(6, 1.00, 600),
    (1.0, 4.0, "counted", "2x"): Found(1606, 1.00, 7200), (1.0, 4.0, "counted", "5x"): Found(276, 1.00, 7200),
    (1.0, 40.0, "counted", "2x"): Found(222, 1.00, 900), (1.0, 40.0, "counted", "5x"): Found(49, 1.00, 900),
    (1.0, 400.0, "counted", "2x"): Found(45, 1.00, 900), (1.0, 400.0, "counted", "5x"): Found(13, 1.00, 900),
    (5.0, 40.0, "counted", "2x"): Found(245, 1.00, 900), (5.0, 40.0, "counted", "5x"): Found(78, 1.00, 900),
    (1.0, 4.0, "mass", "2x"): Found(5936, 0.70, 7200), (1.0, 4.0, "mass", "5x"): Found(389, 1.00, 7200),
    (1.0, 40.0, "mass", "2x"): Found(math.inf, 0.16, 600), (1.0, 40.0, "mass", "5x"): Found(55, 1.00, 600),
    (1.0, 400.0, "mass", "2x"): Found(371, 0.84, 600), (1.0, 400.0, "mass", "5x"): Found(10, 1.00, 600),
}

HEAVY_TAIL: dict[tuple[float, float, str], float] = {
    (1.0, 4.0, "counted"): 0.0100, (1.0, 40.0, "counted"): 0.0100, (1.0, 400.0, "counted"): 0.0167,
    (5.0, 40.0, "counted"): 0.0233,
    (1.0, 4.0, "mass"): 4.1863, (1.0, 40.0, "mass"): 21.0687, (1.0, 400.0, "mass"): 21.2180,
}
"""(step seconds, req/s, counters' evidence) -> false alarms per version-day of a healthy version
with 0.05% of requests at 1,500 ms (3x the line, beyond `heaviest_slow`): counted, one request
above the line however slow (the stated rate holds, as on a histogram); as mass, many times a day."""

ASSUMED_RPS = 40.0
"""The traffic `validate` prices at when none was seen: the reference."""


@dataclass(frozen=True)
class Price:
    """One trigger's evidence and what it costs, in lines for the operator."""

    evidence: str  # what the trigger reads, in a few words
    cost: str  # what it costs at the traffic
    notes: tuple[str, ...] = ()  # what the policy alone shows about the histogram

    def as_dict(self) -> dict[str, object]:
        return {"evidence": self.evidence, "cost": self.cost, "notes": list(self.notes)}


def level(rps: float) -> float:
    """The measured traffic level nearest `rps` (on a log scale)."""
    if rps <= 0:
        return LEVELS[0]
    return min(LEVELS, key=lambda lv: abs(math.log(rps / lv)))


def _seconds(s: float) -> str:
    return f"~{s / 60:.0f} min" if s >= 600 else f"~{s:.0f} s"


def _window(s: float) -> str:
    return f"{s / 3600:g} h" if s >= 3600 else f"{s / 60:g} min"


def _found(f: Found) -> str:
    if math.isinf(f.median_s):
        return f"is found within {_window(f.within_s)} in {f.share:.0%} of runs"
    return f"is found in {_seconds(f.median_s)} (median; {f.share:.0%} of runs within {_window(f.within_s)})"


def _line(p: TailExcessParams, query: str) -> str:
    name = metric_name(query)
    unit = p.line_unit or (metric_unit(name) if name is not None else None)
    if unit is None:
        return f"{p.line:g} (the metric's unit)"
    return f"{p.line:g} {unit}" + ("" if unit == "ms" else f" ({convert(p.line, unit, 'ms'):g} ms)")


def price(p: TailExcessParams, query: str, source: str, step_seconds: float, rps: float | None) -> Price:
    """What `p`'s evidence read by `query` costs at `rps` requests per second per version (None:
    none seen yet, the reference assumed), at steps of `step_seconds`."""
    lv = level(rps if rps is not None else ASSUMED_RPS)
    traffic = (f"at {rps:.3g} req/s seen" if rps is not None else f"at {ASSUMED_RPS:g} req/s assumed (none seen yet)")
    traffic += "" if rps is None or lv == rps else f", measured at {lv:g}"
    slow_steps = (f"; measured at 1 s steps, at {step_seconds:g} s steps up to a step later"
                  if step_seconds > 1 else "")
    hist2x = CURVE[(1.0, lv, "histogram", "2x")]
    if p.evidence == "histogram":
        bound = bucket_bound(query)
        if bound is not None and bound > p.line:
            return Price(f"histogram, bucket le={bound:g} above the line {_line(p, query)}",
                         f"requests between the line and {bound:g} are not counted: a breach there (0.2% at 1.2x "
                         "the line) is never found; give the histogram a bound at the line",
                         _notes(p, query, source))
        return Price(f"histogram, bucket at the line {_line(p, query)} (requests above it counted exactly)",
                     f"{traffic}: a 2x breach (0.2% at 1.2x the line) {_found(hist2x)}, 0.5% at 1.8x the line "
                     f"{_found(CURVE[(1.0, lv, 'histogram', '5x')])}; the stated rate holds however slow the healthy "
                     f"tail{slow_steps}", _notes(p, query, source))
    steps = f"{step_seconds:g} s steps" if step_seconds > 1 else "1 s steps"
    per_step = (rps if rps is not None else ASSUMED_RPS) * step_seconds
    if counting_problem(per_step, p.sizes[0] * p.budget, step_seconds) is None:
        # Counted per step (detectors/_slow_counts.py): the figures of the step measured nearest.
        measured = 5.0 if step_seconds > 1 and (5.0, lv, "counted", "2x") in CURVE else 1.0
        caveat = ("" if measured == step_seconds else
                  f"; measured at {measured:g} s steps" + ("" if measured > 1 else
                                                           f", at {step_seconds:g} s steps slower (not measured)"))
        return Price(f"counters at {steps}, slow requests counted per step (a request above {_line(p, query)} "
                     "counts once, however slow)",
                     f"{traffic}: a 2x breach (0.2% at 1.2x the line) {_found(CURVE[(measured, lv, 'counted', '2x')])}, "
                     f"0.5% at 1.8x the line {_found(CURVE[(measured, lv, 'counted', '5x')])}; the stated rate holds "
                     f"however slow the healthy tail (0.05% at 3x the line: ~{HEAVY_TAIL[(measured, lv, 'counted')]:.2g} "
                     f"alarms a version-day){caveat}; a histogram with a bound at the line finds the 2x breach "
                     f"{_found(hist2x).removeprefix('is found ')}", ())
    caveat = (f"; at {step_seconds:g} s steps slower still (not measured: slow requests share steps)"
              if step_seconds > 1 else "")
    return Price(f"counters at {steps}, read as latency mass over the bulk (~{per_step:.0f} requests a step are too "
                 f"many to count slow requests in), not a count of requests above {_line(p, query)}",
                 f"{traffic}: a 2x breach (0.2% at 1.2x the line) {_found(CURVE[(1.0, lv, 'mass', '2x')])}, 0.5% at "
                 f"1.8x the line {_found(CURVE[(1.0, lv, 'mass', '5x')])}; a healthy tail slower than "
                 f"{p.heaviest_slow:g}x the line (0.05% at 3x) alarms ~{HEAVY_TAIL[(1.0, lv, 'mass')]:.2g} times a "
                 f"version-day{caveat}; a histogram with a bound at the line finds the 2x breach "
                 f"{_found(hist2x).removeprefix('is found ')}", ())


def _notes(p: TailExcessParams, query: str, source: str) -> tuple[str, ...]:
    """What the policy alone shows about its histogram bucket."""
    bound = bucket_bound(query)
    notes = []
    if bound is not None:
        missing = bounds_note(query, bound)
        if missing is not None:
            notes.append(missing)
        written = query.split('le="', 1)[1].split('"', 1)[0] if 'le="' in query else ""
        if source == "prometheus" and written and "." not in written and "Inf" not in written:
            notes.append(f'Prometheus 3 stores bounds as floats (le="{bound:.1f}"): there, le="{written}" selects '
                         "nothing (Prometheus 2 keeps the exporter's form)")
    return tuple(notes)


def policy_prices(policy: LoadedPolicy, seen: Mapping[int, float | None] | None = None) -> list[tuple[int, Price]]:
    """Each `tail_excess` trigger of `policy` (by trigger index) and its price, at the requests per
    second per version `seen` for it (by trigger index; absent or None: the reference assumed)."""
    out = []
    for bound in policy.detectors:
        if not isinstance(bound.params, TailExcessParams) or bound.trigger.type != "tail_excess":
            continue
        rps = (seen or {}).get(bound.index)
        out.append((bound.index, price(bound.params, bound.trigger.query, bound.trigger.source,
                                       float(bound.trigger.interval), rps)))
    return out


def price_lines(policy: LoadedPolicy) -> list[str]:
    """What `tailguard validate` prints under a policy: each trigger's evidence, its price at the
    reference traffic, and its notes."""
    lines = []
    for index, p in policy_prices(policy):
        lines.append(f"trigger {index} evidence: {p.evidence}; {p.cost}")
        lines.extend(f"note: trigger {index}: {note}" for note in p.notes)
    return lines
