"""What a plan measures of its probe: a small-batch run to the target with the noise probe on (the
steps it took, B_simple and its trend); the compute is timed in :mod:`lbsgd.plan.timing`.

The run is an ordinary ``lbsgd train`` run (``noise_scale=true``; for an error target
``stop_at_error`` and ``eval_per_octave``, so it ends at the evaluation that reaches the target),
or one already made that the plan is pointed at. Reading it needs only its ``config.yaml`` and
``metrics.jsonl``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lbsgd import data, tracking
from lbsgd.config import Config, ConfigError, load, read_yaml

ERROR_KEY = "val_top1_error_pct"  # the held-out error (the test split's without a holdout)
PER_OCTAVE = 4  # the probe's evaluations per doubling of the step count (study 15's)
LOSS_WINDOW_EPOCHS = 0.1  # a loss target reads the training loss's moving average over this
EXTRAPOLATE_AT_MOST = 4.0  # a target past the probe's end by more than this factor is refused
TREND_POINTS = (0.1, 0.25, 0.5, 0.75, 1.0)  # B_simple at these shares of the probe's steps


@dataclass(frozen=True)
class Target:
    """``error`` (held-out top-1 error, %) or ``loss`` (the training loss's moving average)."""

    kind: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        kind, _, value = text.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        ok = (kind == "error" and 0 < v < 100) or (kind == "loss" and v > 0)
        if not ok:
            raise ConfigError(
                f"--target={text!r}: expected error=PCT (held-out top-1 error, 0 < PCT < 100) "
                "or loss=VALUE (training loss, > 0)"
            )
        return cls(kind, v)

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


@dataclass
class Probe:
    """What the small-batch run measured."""

    run_dir: str
    source: str  # "ran" (the plan trained it) or "pointed at" (--reference)
    batch: int
    steps: float  # to the target (measured, or extrapolated: ``extrapolation`` names how)
    last_step: int
    extrapolation: str | None
    b_at_target: float  # the smoothed B_simple at the target (at the end when extrapolated)
    trend: list[tuple[int, float]] = field(default_factory=list)  # (step, B_simple) over the run
    growth: float = math.nan  # B_simple's growth per doubling of the steps (second half, fitted)
    img_per_s: float = math.nan  # the run's own throughput, steady state (median of its flushes)
    lr: float = math.nan  # its peak lr
    b_range: tuple[float, float] | None = None  # B at the target: 95% interval (noise_interval)
    steps_range: tuple[float, float] | None = None  # its steps: the evaluations around them


# -- the run -------------------------------------------------------------------------------------


def probe_keys(cfg: Config, target: Target, out: Path, probe_epochs: float | None) -> dict:
    """The keys over ``cfg`` of the probe run: the noise probe on at small batches of one
    micro-batch (two at least per step), for an error target ending where it reaches it."""
    micro = cfg.micro_batch if isinstance(cfg.micro_batch, int) else cfg.bn_batch
    if cfg.batch_size < 2 * micro:
        raise ConfigError(
            f"batch_size={cfg.batch_size}: the plan's probe needs at least two micro-batches of "
            f"{micro} per step to measure the noise scale; use batch_size >= {2 * micro}"
        )
    keys = {
        "noise_scale": True,
        "noise_scale_batch": micro,
        "out_dir": str(out),
        "study": "probe",
        "resume": True,  # an interrupted plan's probe goes on where it stopped
    }
    if target.kind == "error":
        keys |= {"stop_at_error": target.value, "eval_per_octave": PER_OCTAVE}
    if probe_epochs is not None:
        keys["epochs"] = probe_epochs
    return keys


def run_probe(cfg: Config) -> Path:
    """Train the probe run (in this process); its folder. A run asked to stop (Ctrl-C, SIGTERM:
    it stops at a flush with a checkpoint, which the same plan again resumes from) is an
    interrupt of the plan, not a probe to read."""
    from lbsgd.entry import train

    if train(cfg)["status"] == "interrupted":
        raise KeyboardInterrupt(f"{cfg.study} run stopped at a checkpoint in {cfg.run_dir()}")
    return cfg.run_dir()


# -- reading a run -------------------------------------------------------------------------------


def read_run(run_dir: Path) -> tuple[Config, list[dict]]:
    """(the config, metrics.jsonl's records) of a run; one line if it has none."""
    cfg_file, metrics = Path(run_dir, "config.yaml"), Path(run_dir, "metrics.jsonl")
    if not cfg_file.is_file() or not metrics.is_file():
        raise ConfigError(
            f"--reference={run_dir}: not a run folder (needs its config.yaml and metrics.jsonl)"
        )
    return load([cfg_file]), tracking.read_records(metrics)


NOISE_WINDOW = 2**-0.5  # the noise scale's interval reads the steps from this share of the target's
NOISE_BLOCKS = 10  # in this many consecutive blocks of steps (neighbouring steps' estimates
# share their EMA's history, blocks far less), resampled
NOISE_RESAMPLES = 2000


def noise_interval(records: Sequence[dict], at: float) -> tuple[float, float] | None:
    """A 95% interval of the noise scale at step ``at``: tr(Σ) over |G|² of the steps' unsmoothed
    estimates in the half octave before it, cut into :data:`NOISE_BLOCKS` consecutive blocks
    whose means are resampled in pairs (scipy's bootstrap, percentile, a fixed generator); None
    with too few steps or a |G|² that comes out at or below zero."""
    from scipy import stats as sps

    pts = [
        (r["gns_trace"], r["gns_g_sq"])
        for r in records
        if r.get("kind") == "train"
        and r.get("gns_g_sq") is not None
        and r.get("gns_trace") is not None
        and NOISE_WINDOW * at <= r["step"] <= at
    ]
    if len(pts) < 2 * NOISE_BLOCKS:
        return None
    blocks = np.array_split(np.array(pts, dtype=float), NOISE_BLOCKS)
    trace, g_sq = (np.array([b[:, i].mean() for b in blocks]) for i in (0, 1))
    if g_sq.mean() <= 0:
        return None
    res = sps.bootstrap(
        (trace, g_sq),
        lambda t, g, axis=-1: t.mean(axis=axis) / np.clip(g.mean(axis=axis), 1e-30, None),
        paired=True,
        n_resamples=NOISE_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def crossing_bracket(points: Sequence[tuple[float, float]], target: float):
    """The steps of the evaluation before the first that reaches ``target`` and of that one: the
    first crossing lies between them (None where it never does, or at the first point)."""
    for i, (s, v) in enumerate(points):
        if v <= target:
            return (float(points[i - 1][0]), float(s)) if i else None
    return None


def first_crossing(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first step where the (step, value) curve reaches ``target`` (≤), interpolated between
    that point and the one before linearly in log step; None if it never does."""
    for i, (s, v) in enumerate(points):
        if v <= target:
            if i == 0:
                return float(s)
            s0, v0 = points[i - 1]
            frac = (v0 - target) / (v0 - v)
            return float(2 ** (math.log2(s0) + frac * math.log2(s / s0)))
    return None


def _tail_fit(points: Sequence[tuple[float, float]]):
    """(slope, intercept) of log value on log step, least squares over the second half of the
    steps; None with fewer than three points there."""
    tail = [(s, v) for s, v in points if s >= points[-1][0] / 2 and v > 0]
    if len(tail) < 3 or tail[-1][0] <= tail[0][0]:
        return None
    return np.polyfit(np.log([s for s, _ in tail]), np.log([v for _, v in tail]), 1)


def extrapolate(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The step where a power law value = a·step^(−c), fitted to the second half of the curve's
    steps (:func:`_tail_fit`), reaches ``target``; None when the curve does not fall."""
    fit = _tail_fit(points)
    if fit is None or fit[0] >= 0:
        return None
    return float(math.exp((math.log(target) - fit[1]) / fit[0]))


def noise_trend(records: Sequence[dict], last: float) -> tuple[list[tuple[int, float]], float]:
    """B_simple (smoothed) at :data:`TREND_POINTS` of the steps up to ``last``, and its growth
    per doubling of the steps: 2^slope of log B on log step over the second half of the steps
    (:func:`_tail_fit`; NaN with fewer than three points there)."""
    pts = sorted(
        (r["step"], r["gns_b_simple_ema"])
        for r in records
        if r.get("kind") == "train"
        and r.get("gns_b_simple_ema") is not None
        and r["step"] <= math.ceil(last)
    )
    if not pts:
        raise ConfigError(
            "the probe run measured no noise scale (noise_scale=true with at least two small "
            "batches per step)"
        )
    trend = [
        min(pts, key=lambda p: abs(p[0] - max(1, round(f * pts[-1][0])))) for f in TREND_POINTS
    ]
    fit = _tail_fit(pts)
    growth = math.nan if fit is None else float(2 ** fit[0])
    return [(int(s), float(b)) for s, b in trend], growth


def curve(cfg: Config, records: Sequence[dict], target: Target) -> list[tuple[float, float]]:
    """The (step, value) curve a target is read on, by step: the held-out error of the
    evaluations, or the training loss's moving average over :data:`LOSS_WINDOW_EPOCHS` from the
    first full window."""
    if target.kind == "error":
        pts = {
            r["step"]: r[ERROR_KEY] for r in records if r.get("kind") == "eval" and ERROR_KEY in r
        }
        return sorted((float(s), float(v)) for s, v in pts.items() if v is not None)
    window = max(1, round(LOSS_WINDOW_EPOCHS * data.train_size(cfg) / cfg.batch_size))
    train = sorted((r["step"], r["loss"]) for r in records if r.get("kind") == "train")
    if len(train) < window:
        return []
    steps, loss = np.array(train, dtype=float).T  # a loss of None: NaN
    avg = np.convolve(loss, np.ones(window) / window, mode="valid")
    return list(zip(steps[window - 1 :].tolist(), avg.tolist(), strict=True))


def steps_to(curve: Sequence[tuple[float, float]], target: Target, last: int):
    """(steps to the target, how they were extrapolated or None): the first crossing, else the
    power law past the run's end; one line when the run is there at its first point or does not
    approach the target (the power law reaching past :data:`EXTRAPOLATE_AT_MOST` × its steps)."""
    steps = first_crossing(curve, target.value)
    if steps is not None and steps <= curve[0][0]:
        raise ConfigError(
            f"--target={target}: the run is there at its first point (step {curve[0][0]:.0f}), "
            "so its steps to the target say nothing; choose a harder target"
        )
    if steps is not None:
        return steps, None
    steps = extrapolate(curve, target.value)
    if steps is None or steps > EXTRAPOLATE_AT_MOST * last:
        raise ConfigError(
            f"--target={target}: the probe's {target.kind} ends at {curve[-1][1]:.4g} after "
            f"{last} steps and does not approach {target.value:g} (a power law through its "
            f"second half reaches it {'never' if steps is None else f'at step {steps:.0f}'}; "
            f"at most {EXTRAPOLATE_AT_MOST:g}x the probe's steps are extrapolated)"
        )
    return steps, (
        f"extrapolated: a power law {target.kind} = a*step^-c fitted to the second half of the "
        f"probe's {len(curve)} points, from its last step {last}"
    )


def read_probe(run_dir: Path, target: Target, source: str) -> Probe:
    """The probe's measurements from a run's files; one line when the run does not approach the
    target (:func:`steps_to`)."""
    cfg, records = read_run(run_dir)
    points = curve(cfg, records, target)
    if not points:
        raise ConfigError(f"--target={target}: the run in {run_dir} has no {target.kind} curve")
    last = int(max(r["step"] for r in records if "step" in r))
    steps, how = steps_to(points, target, last)
    trend, growth = noise_trend(records, min(steps, last))
    b_target = trend[-1][1]
    if how is not None and math.isfinite(growth):  # B_simple carried on along its trend
        b_target *= growth ** math.log2(steps / trend[-1][0])
    b_range = noise_interval(records, min(steps, last))  # widened to hold the EMA's reading
    if b_range is not None:  # there, and carried on to the target as the reading is
        lo, hi = min(b_range[0], trend[-1][1]), max(b_range[1], trend[-1][1])
        b_range = lo * b_target / trend[-1][1], hi * b_target / trend[-1][1]
    rates = [r["img_per_s"] for r in records if r.get("kind") == "train" and r.get("img_per_s")]
    return Probe(
        run_dir=str(run_dir),
        source=source,
        batch=cfg.batch_size,
        steps=float(steps),
        last_step=last,
        extrapolation=how,
        b_at_target=float(b_target),
        trend=trend,
        growth=growth,
        img_per_s=float(statistics.median(rates[len(rates) // 2 :])) if rates else math.nan,
        lr=float(read_yaml(Path(run_dir, "config.yaml"), derived=True)["lr"]),  # config.derive's
        b_range=b_range,
        steps_range=crossing_bracket(points, target.value) if how is None else None,
    )
