"""The test in the other direction: does a version's evidence show it within its budget?

Wald's sequential probability ratio test accepts the null when the likelihood ratio of the
alternative against it falls to `error`: for the smallest regression the bank watches (2x the
budget by default) against the null (half budget), over all the requests of the window,
Lambda = units x ln(r) - requests x null x (r - 1). Accepting at Lambda <= ln(error) is wrong
(the version is in fact at the alternative, or worse) with probability at most `error`: under the
alternative, P(LR <= e) <= e (Markov's inequality on 1/LR, whose mean under it is 1); a worse
regression makes acceptance rarer still. A gate on an alert trigger vetoes only on acceptance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import chi2


@dataclass(frozen=True)
class Acceptance:
    """The verdict of the acceptance test on one window of evidence."""

    accepted: bool
    log_ratio: float  # Lambda: ln of how much likelier the alternative made the evidence
    line: float  # ln(error): Lambda at or below it accepts
    units: float
    requests: float
    null: float
    alternative: float

    def describe(self) -> str:
        share = self.units / self.requests if self.requests > 0 else float("nan")
        verdict = "within budget" if self.accepted else "not shown within budget"
        return (f"{verdict}: {self.units:.1f} above the line in {self.requests:.0f} requests ({share:.3%}); "
                f"log LR of {self.alternative:.2%} vs {self.null:.2%} = {self.log_ratio:.2f} "
                f"({'<=' if self.accepted else '>'} ln error {self.line:.2f})")


def accept_null(units: float, requests: float, null: float, alternative: float, error: float) -> Acceptance:
    """Whether `units` above the line in `requests` accept `null` against `alternative` (shares of
    requests) at `error`."""
    if not 0 < error < 1:
        raise ValueError(f"error {error} is not in (0, 1)")
    ratio = alternative / null
    llr = units * math.log(ratio) - requests * null * (ratio - 1.0)
    line = math.log(error)
    return Acceptance(llr <= line, llr, line, units, requests, null, alternative)


def upper_share(units: float, requests: float) -> float:
    """The 95% upper bound of a share above the line from `units` in `requests` (Poisson)."""
    if requests <= 0:
        return math.inf
    return float(chi2.ppf(0.975, 2 * (units + 1)) / 2) / requests


def lower_share(units: float, requests: float) -> float:
    """The 95% lower bound of a share above the line from `units` in `requests` (Poisson)."""
    if requests <= 0 or units <= 0:
        return 0.0
    return float(chi2.ppf(0.025, 2 * units) / 2) / requests


def shown_above(units: float, requests: float, allowed: float) -> bool:
    """Whether `units` above the line in `requests` show the share above `allowed` (the budget) at
    95%: what makes a second version's slowdown a shared one (detectors/tail_excess_batch.py,
    policies/gate.py, the canary judge)."""
    return lower_share(units, requests) > allowed
