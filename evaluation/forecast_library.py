"""The forecast scenario library: seeded latency series at 30 s steps with a 500 ms line, for scoring
forecasters on what a forecast can see (leaks, a capacity knee, step-then-ramp) and on healthy series
that must not fire (seasonality, bursts, level shifts, noise near the line, counter resets, gaps).

The committed file (fixtures/forecast_library/library.npz, its manifest and checksums) is what the
evaluation reads; ``python -m evaluation.forecast_library --write`` regenerates it from the seeds
below and ``--check`` compares a fresh generation with the committed checksums.

Every series is ``level * exp(sigma * z)``: a noise-free level (the latency the users feel) times
log-normal noise with sigma drawn per series from 5-15%, i.i.d. per scrape. A breach is the *level*
reaching the line: noise alone never is one. Values are kept in 0.1 ms units (uint16; 0 = no scrape).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from numpy.typing import NDArray

STEP_SECONDS = 30.0
LINE_MS = 500.0
T0 = 1_704_067_200.0  # 2024-01-01T00:00:00Z: every series starts here
SEEDS = 20
NOISE_RANGE = (0.05, 0.15)
PRE_HISTORY_SECONDS = 3 * 3600.0  # positives: three healthy hours before the incident begins
AFTER_CROSSING_SECONDS = 20 * 60.0  # positives: kept past the level crossing
HEALTHY_SECONDS = 86400.0  # healthy series: one day each
VALUE_UNIT_MS = 0.1  # stored resolution of values and levels (uint16: up to 6553.5 ms, a knee
# past saturation is clipped there)
RATE_UNIT = 0.1  # req/s

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "forecast_library"
FLOAT = NDArray[np.float64]


@dataclass(frozen=True)
class LibrarySeries:
    """One series of the library: what a scrape saw, the level behind it, and what happened."""

    name: str  # "<shape>/<seed>"
    shape: str
    kind: str  # "rise" (a breach comes) or "healthy" (the level stays under the line)
    timestamps: FLOAT  # every 30 s step, including missed scrapes
    values: FLOAT  # ms; NaN where the scrape was missed
    level: FLOAT  # ms, noise-free
    sigma: float  # log-normal noise of this series
    incident_start: float | None  # rise: when the level starts to move toward the line
    crossing_time: float | None  # rise: when the level first reaches the line
    rate: FLOAT | None = None  # request rate (req/s) where the shape has one (knee, bursts)

    @property
    def days(self) -> float:
        return float(self.timestamps[-1] - self.timestamps[0] + STEP_SECONDS) / 86400.0


@dataclass(frozen=True)
class _Made:
    level: FLOAT
    incident_start: float | None = None
    rate: FLOAT | None = None
    missing: NDArray[np.bool_] | None = None
    multiplier: FLOAT | None = None  # extra factors on the observed value (a reset's cold start)


def _grid(seconds: float) -> FLOAT:
    return T0 + STEP_SECONDS * np.arange(int(round(seconds / STEP_SECONDS)))


def _rise_grid(minutes_to_cross: float) -> tuple[FLOAT, float]:
    t = _grid(PRE_HISTORY_SECONDS + minutes_to_cross * 60.0 + AFTER_CROSSING_SECONDS)
    return t, T0 + PRE_HISTORY_SECONDS


def _leak(rate_ms_per_min: float) -> Callable[[np.random.Generator], _Made]:
    def make(rng: np.random.Generator) -> _Made:
        t, start = _rise_grid((LINE_MS - 200.0) / rate_ms_per_min)
        return _Made(200.0 + rate_ms_per_min * np.maximum(t - start, 0.0) / 60.0, start)
    return make


def _accelerating(rng: np.random.Generator) -> _Made:
    """200 ms, then 200 + 300 (dt / T)^2: crosses at T, drawn from 20-60 min."""
    minutes = rng.uniform(20.0, 60.0)
    t, start = _rise_grid(minutes)
    return _Made(200.0 + 300.0 * (np.maximum(t - start, 0.0) / (60.0 * minutes)) ** 2, start)


def _knee(rng: np.random.Generator) -> _Made:
    """Latency b / (1 - load): load starts at 0.4-0.6 of capacity and the request rate grows by 1%
    a minute; before, traffic wobbles +/-8% (an hourly wave and noise), so latency and rate co-vary."""
    load0 = rng.uniform(0.4, 0.6)
    service_ms = 200.0 * (1.0 - load0)
    cross_load = 1.0 - service_ms / LINE_MS
    minutes = float(np.log(cross_load / load0) / np.log(1.01))
    t, start = _rise_grid(minutes)
    capacity = rng.uniform(80.0, 400.0)  # req/s the instances serve
    wave = 1.0 + 0.05 * np.sin(2 * np.pi * (t - T0) / 3600.0 + rng.uniform(0, 2 * np.pi))
    wobble = wave * np.exp(rng.normal(0.0, 0.03, t.size))
    growth = 1.01 ** (np.maximum(t - start, 0.0) / 60.0)
    load = np.minimum(load0 * growth * wobble, 0.999)
    return _Made(service_ms / (1.0 - load), start, rate=load * capacity)


def _step_ramp(rng: np.random.Generator) -> _Made:
    """A deploy adds 80 ms at once, then the new version leaks 5 ms a minute."""
    t, start = _rise_grid((LINE_MS - 280.0) / 5.0)
    dt = t - start
    return _Made(np.where(dt >= 0, 280.0 + 5.0 * np.maximum(dt, 0.0) / 60.0, 200.0), start)


def _seasonal(rng: np.random.Generator) -> _Made:
    t = _grid(HEALTHY_SECONDS)
    return _Made(300.0 * (1.0 + 0.3 * np.sin(2 * np.pi * (t - T0) / 86400.0 + rng.uniform(0, 2 * np.pi))))


def _bursts(rng: np.random.Generator) -> _Made:
    """3x traffic for 2 minutes, about once an hour: latency b / (1 - load) rises with the load and
    stays under the line (base load 0.1-0.2, so 3x is at most 0.6)."""
    t = _grid(HEALTHY_SECONDS)
    load0 = rng.uniform(0.1, 0.2)
    base_ms = rng.uniform(150.0, 200.0)
    service_ms = base_ms * (1.0 - load0)
    mult = np.ones(t.size)
    for at in np.sort(rng.uniform(0, t.size - 8, rng.poisson(24))).astype(int):
        mult[at : at + 4] = 3.0  # 4 steps = 2 minutes
    load = load0 * mult * np.exp(rng.normal(0.0, 0.03, t.size))
    return _Made(service_ms / (1.0 - load), rate=load * rng.uniform(50.0, 200.0) / load0)


def _level_shifts(rng: np.random.Generator) -> _Made:
    """Deploys that move the level at random times to anywhere in 150-450 ms (under the line)."""
    t = _grid(HEALTHY_SECONDS)
    level = np.full(t.size, rng.uniform(200.0, 300.0))
    for at in np.sort(rng.integers(60, t.size, rng.poisson(5))):
        level[at:] = rng.uniform(150.0, 450.0)
    return _Made(level)


def _near_line(rng: np.random.Generator) -> _Made:
    """The level hovers at 80% of the line (a slow +/-2% wave); noise takes single scrapes over it."""
    t = _grid(HEALTHY_SECONDS)
    return _Made(0.8 * LINE_MS * (1.0 + 0.02 * np.sin(2 * np.pi * (t - T0) / 5400.0 + rng.uniform(0, 6.3))))


def _slow_wander(rng: np.random.Generator) -> _Made:
    """A mean-reverting level (2 h time scale) around 300 ms, kept within 180-440 ms: drifts up for
    an hour at ~1-2 ms/min and turns before the line."""
    t = _grid(HEALTHY_SECONDS)
    tau = 7200.0 / STEP_SECONDS
    x = np.empty(t.size)
    x[0] = 0.0
    shocks = rng.normal(0.0, 60.0 * np.sqrt(2.0 / tau), t.size)
    for i in range(1, t.size):
        x[i] = x[i - 1] * (1.0 - 1.0 / tau) + shocks[i]
    return _Made(np.clip(300.0 + x, 180.0, 440.0))


def _counter_resets(rng: np.random.Generator) -> _Made:
    """Pod restarts: 2-6 scrapes missing, then two scrapes of cold-start latency (1.2-1.6x)."""
    t = _grid(HEALTHY_SECONDS)
    level = 250.0 * (1.0 + 0.1 * np.sin(2 * np.pi * (t - T0) / 86400.0 + rng.uniform(0, 6.3)))
    missing = np.zeros(t.size, dtype=bool)
    mult = np.ones(t.size)
    for at in rng.integers(100, t.size - 10, rng.integers(4, 9)):
        gap = int(rng.integers(2, 7))
        missing[at : at + gap] = True
        mult[at + gap : at + gap + 2] = rng.uniform(1.2, 1.6)
    return _Made(level, missing=missing, multiplier=mult)


def _scrape_gaps(rng: np.random.Generator) -> _Made:
    """3% of scrapes missed at random, and 3-6 outages of 5-40 minutes."""
    t = _grid(HEALTHY_SECONDS)
    level = 300.0 * (1.0 + 0.15 * np.sin(2 * np.pi * (t - T0) / 86400.0 + rng.uniform(0, 6.3)))
    missing = rng.random(t.size) < 0.03
    for at in rng.integers(0, t.size - 100, rng.integers(3, 7)):
        missing[at : at + int(rng.integers(10, 81))] = True
    return _Made(level, missing=missing)


SHAPES: dict[str, tuple[str, Callable[[np.random.Generator], _Made]]] = {
    "leak_3": ("rise", _leak(3.0)),
    "leak_6": ("rise", _leak(6.0)),
    "leak_12": ("rise", _leak(12.0)),
    "leak_25": ("rise", _leak(25.0)),
    "accelerating": ("rise", _accelerating),
    "knee": ("rise", _knee),
    "step_ramp": ("rise", _step_ramp),
    "seasonal": ("healthy", _seasonal),
    "bursts": ("healthy", _bursts),
    "level_shifts": ("healthy", _level_shifts),
    "near_line": ("healthy", _near_line),
    "slow_wander": ("healthy", _slow_wander),
    "counter_resets": ("healthy", _counter_resets),
    "scrape_gaps": ("healthy", _scrape_gaps),
}
"""Shape name -> (kind, generator). Seeds are ``hash(shape) + seed``, so shapes are independent."""


def _seed_for(shape: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{shape}/{seed}".encode()).digest()[:8], "big")


def generate(shape: str, seed: int) -> LibrarySeries:
    """One series, exactly as committed (before quantization to 0.1 ms)."""
    kind, make = SHAPES[shape]
    rng = np.random.default_rng(_seed_for(shape, seed))
    sigma = float(rng.uniform(*NOISE_RANGE))
    made = make(rng)
    n = made.level.size
    t = T0 + STEP_SECONDS * np.arange(n)
    observed = made.level * np.exp(sigma * rng.standard_normal(n))
    if made.multiplier is not None:
        observed = observed * made.multiplier
    observed = _quantize(observed, VALUE_UNIT_MS)
    if made.missing is not None:
        observed = np.where(made.missing, np.nan, observed)
    level = _quantize(made.level, VALUE_UNIT_MS)
    crossing = None
    if kind == "rise":
        over = np.nonzero(level >= LINE_MS)[0]
        crossing = float(t[over[0]]) if over.size else None
    elif np.any(level >= LINE_MS):
        raise AssertionError(f"{shape}/{seed}: a healthy level reached the line")
    rate = None if made.rate is None else _quantize(made.rate, RATE_UNIT)
    return LibrarySeries(f"{shape}/{seed:02d}", shape, kind, t, observed, level, sigma,
                         made.incident_start, crossing, rate)


def _quantize(x: FLOAT, unit: float) -> FLOAT:
    """What the uint16 store keeps: multiples of `unit`, clipped to what 16 bits hold."""
    return np.round(np.clip(x, unit, 65535 * unit) / unit) * unit


def generate_all() -> list[LibrarySeries]:
    return [generate(shape, seed) for shape in SHAPES for seed in range(SEEDS)]


def _arrays(series: list[LibrarySeries]) -> dict[str, NDArray[np.generic]]:
    out: dict[str, NDArray[np.generic]] = {}
    for s in series:
        key = s.name.replace("/", "__")
        stored = np.where(np.isnan(s.values), 0.0, np.round(s.values / VALUE_UNIT_MS))
        out[f"{key}__values"] = stored.astype(np.uint16)
        out[f"{key}__level"] = np.round(s.level / VALUE_UNIT_MS).astype(np.uint16)
        if s.rate is not None:
            out[f"{key}__rate"] = np.round(s.rate / RATE_UNIT).astype(np.uint16)
    return out


def _manifest(series: list[LibrarySeries]) -> dict[str, object]:
    return {
        "generator": "evaluation/forecast_library.py", "numpy": np.__version__,
        "step_seconds": STEP_SECONDS, "line_ms": LINE_MS, "t0": T0, "value_unit_ms": VALUE_UNIT_MS,
        "rate_unit": RATE_UNIT,
        "series": [{"name": s.name, "shape": s.shape, "kind": s.kind, "sigma": round(s.sigma, 6),
                    "points": int(s.timestamps.size), "incident_start": s.incident_start,
                    "crossing_time": s.crossing_time, "has_rate": s.rate is not None} for s in series],
    }


def write(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Generate every series and write library.npz, manifest.json and SHA256SUMS into `directory`."""
    series = generate_all()
    directory.mkdir(parents=True, exist_ok=True)
    npz = directory / "library.npz"
    np.savez_compressed(npz, **_arrays(series))  # type: ignore[arg-type]
    manifest = directory / "manifest.json"
    manifest.write_text(json.dumps(_manifest(series), indent=1) + "\n")
    sums = directory / "SHA256SUMS"
    sums.write_text(f"{_sha_of_arrays(series)}  arrays (values, level, rate; see evaluation/forecast_library.py)\n"
                    f"{hashlib.sha256(manifest.read_bytes()).hexdigest()}  manifest.json\n")
    return [npz, manifest, sums]


def _sha_of_arrays(series: list[LibrarySeries]) -> str:
    """A checksum of the arrays' bytes in name order (the npz container's own bytes carry zip times)."""
    h = hashlib.sha256()
    for name, arr in sorted(_arrays(series).items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def load(directory: Path = DEFAULT_DIR, shapes: set[str] | None = None) -> list[LibrarySeries]:
    """The committed library (or the shapes named), in manifest order."""
    meta = json.loads((directory / "manifest.json").read_text())
    out = []
    with np.load(directory / "library.npz") as data:
        for m in meta["series"]:
            if shapes is not None and m["shape"] not in shapes:
                continue
            key = m["name"].replace("/", "__")
            raw = data[f"{key}__values"].astype(np.float64)
            values = np.where(raw == 0, np.nan, raw * meta["value_unit_ms"])
            t = meta["t0"] + meta["step_seconds"] * np.arange(values.size)
            rate = data[f"{key}__rate"] * RATE_UNIT if m["has_rate"] else None
            level = data[f"{key}__level"] * meta["value_unit_ms"]
            out.append(LibrarySeries(m["name"], m["shape"], m["kind"], t, values, level, float(m["sigma"]),
                                     m["incident_start"], m["crossing_time"], rate))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="regenerate the committed files")
    ap.add_argument("--check", action="store_true", help="regenerate in memory and compare checksums")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = ap.parse_args(argv)
    if args.write:
        for path in write(args.dir):
            print(f"wrote {path} ({path.stat().st_size} bytes)")
    if args.check:
        want = (args.dir / "SHA256SUMS").read_text().split()[0]
        got = _sha_of_arrays(generate_all())
        print("arrays match the committed checksum" if got == want else f"MISMATCH: {got} != {want}")
        return 0 if got == want else 1
    if not (args.write or args.check):
        lib = load(args.dir)
        for kind in ("rise", "healthy"):
            members = [s for s in lib if s.kind == kind]
            print(f"{kind}: {len(members)} series, {sum(s.days for s in members):.1f} series-days")
    return 0


if __name__ == "__main__":
    sys.exit(main())
