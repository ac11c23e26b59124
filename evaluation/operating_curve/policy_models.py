"""The example policies as the policy benchmark runs them: each file loaded with the real loader
(policies/loader.py), reduced to what a simulated deploy needs from it: its tail_excess trigger
(the live params, source and interval), its alert triggers and whether it can roll back.

Nothing here decides: the detector's verdicts come from the live `detect_many`, an alert's ruling
from the live gate or governance (evaluation/operating_curve/policy_live.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from detectors.tail_excess import TailExcessParams
from policies.loader import BoundDetector, LoadedPolicy, load_policies

ROLLBACK_KINDS = frozenset({"triton.rollback", "istio.shift_weights"})
"""Action kinds that take a version (or its traffic) away: what a false alarm costs."""
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"


@dataclass(frozen=True)
class PolicyModel:
    """One example policy as the benchmark simulates it."""

    policy: LoadedPolicy
    file: str
    detector: BoundDetector | None  # its tail_excess trigger (None: it has none)
    alerts: tuple[int, ...]  # indices of its live (not shadow) alert triggers
    rolls_back: bool
    skipped: str | None = None  # why the benchmark does not model it (None: it does)

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def params(self) -> TailExcessParams:
        assert self.detector is not None and isinstance(self.detector.params, TailExcessParams)
        return self.detector.params

    @property
    def interval(self) -> float:
        """The detector's poll interval: its grid step (a range query's step, or Triton's /metrics read)."""
        assert self.detector is not None
        return float(self.detector.trigger.interval)

    @property
    def source(self) -> str:
        assert self.detector is not None
        return self.detector.trigger.source

    @property
    def version_label(self) -> str:
        return self.params.version_label

    @property
    def start_alpha(self) -> float:
        """The start test's false alarms per deploy (0: off, or a detector without one)."""
        return float(getattr(self.params, "start_alpha", 0.0))

    @property
    def start_span(self) -> float:
        """Seconds from the deploy the start test covers (its settle and horizon); 905 s, the
        default's, for a detector without one: the deploy's window the per-deploy rate counts."""
        settle = float(getattr(self.params, "start_settle_seconds", 5.0))
        return settle + float(getattr(self.params, "start_horizon_seconds", 900.0))


def model_of(policy: LoadedPolicy, file: str) -> PolicyModel:
    """What the benchmark runs of `policy`, or why it does not run it."""
    triggers = policy.spec.triggers
    alerts = tuple(i for i, t in enumerate(triggers) if t.alert is not None and not t.shadow)
    rolls_back = any(a.kind in ROLLBACK_KINDS for a in policy.actions)
    tails = [d for d in policy.detectors if d.trigger.type == "tail_excess" and not triggers[d.index].shadow]
    others = sorted({d.trigger.type for d in policy.detectors if d.trigger.type != "tail_excess"})
    skipped = None
    if not rolls_back:
        skipped = "no rollback-class action: it cannot roll a version back, so its false-rollback rate is 0"
    elif others:
        skipped = (f"its trigger ({', '.join(others)}) is not tail_excess: "
                   + ("the canary judge is measured by bench/bench_canary.py" if "tail_canary" in others else
                      "a forecast of the summary quantile has no model here (docs/forecasting.md measures it)"))
    elif len(tails) != 1:
        skipped = f"{len(tails)} live tail_excess triggers: the benchmark models exactly one"
    return PolicyModel(policy, file, tails[0] if len(tails) == 1 else None, alerts, rolls_back, skipped)


def example_models(folder: Path = EXAMPLES) -> list[PolicyModel]:
    """Every policy under `folder`, loaded as the daemon loads them, in file order."""
    from daemon.wiring.registries import action_registry, detector_registry

    loaded = load_policies(folder, action_registry(), detector_registry())
    return [model_of(p, Path(p.source).name) for p in loaded.policies]
