"""The lr range test (Smith 2017, "Cyclical Learning Rates for Training Neural Networks", §3.3):
a short run at one batch whose lr rises linearly, step by step, from ``low`` to ``high``; the lr at
which its training loss stops falling and turns up bounds the lr that batch can take.

The run is an ordinary ``lbsgd train`` run (its gradual warmup is the ramp: ``warmup_lr`` low,
``base_lr`` high with ``lr_scaling: none``, the warmup as long as the run, the loss logged every
step), so it trains with the config's model, optimizer, BN groups and data; reading it needs its
``metrics.jsonl`` alone. :mod:`lbsgd.plan` runs it at the largest batch it vouches for and caps
every row's lr by it (:class:`lbsgd.plan.model.Lr`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage

from lbsgd import data, tracking
from lbsgd.config import Config, ConfigError

STEPS = 120  # the ramp's steps (Smith: "several epochs"; 1-2 epochs of Fashion-MNIST at 512-1024)
SMOOTH = 9  # the training loss read through a centred running median of this many steps
RISE = 1.25  # the smoothed loss this far above its minimum so far (or not finite): the bound passed
HIGH = 2.0  # the ramp ends at this times the linear rule's lr at the tested batch


@dataclass(frozen=True)
class RangeTest:
    """What an lr range test measured: at ``batch``, the lr rising from ``low`` to ``high``, the
    smoothed loss's minimum before it turned up at ``bound`` (None: it never turned up)."""

    run_dir: str
    batch: int
    low: float
    high: float
    bound: float | None
    turned_at: float | None  # the lr at which the smoothed loss passed RISE x its minimum
    diverged: bool  # the run stopped on a non-finite loss

    def describe(self) -> str:
        ramp = f"lr range test at batch {self.batch} (lr {self.low:.3g} to {self.high:.3g})"
        if self.bound is None:
            return f"{ramp}: the loss fell to the end, no bound up to {self.high:.3g}"
        how = ", then diverged" if self.diverged else ""
        return (
            f"{ramp}: the loss stopped falling at lr {self.bound:.3g} (x{RISE:g} its minimum or "
            f"not finite by lr {self.turned_at:.3g}{how})"
        )


def keys(cfg: Config, batch: int, low: float, high: float) -> dict:
    """The keys over ``cfg`` (the probe's config) of a range test at ``batch``: one ramp of
    :data:`STEPS` steps, the loss every step, no probe, no evaluation but the last."""
    if not 0 < low < high:
        raise ConfigError(f"lr range test: expected 0 < low < high, got {low:g} and {high:g}")
    epochs = STEPS * batch / data.train_size(cfg)
    return {
        "batch_size": batch,
        "lr_scaling": "none",
        "base_lr": high,
        "warmup": "gradual",
        "warmup_lr": low,
        "warmup_epochs": epochs,
        "epochs": epochs,
        "stop_at_error": None,
        "eval_every": 0,
        "eval_per_octave": 0,
        "noise_scale": False,
        "noise_scale_batch": None,
        "log_every": 1,
        "checkpoint": False,
    }


def read(run_dir: Path) -> RangeTest:
    """The range test of a run made with :func:`keys` (its ramp read from its config)."""
    from lbsgd.config import load

    cfg = load([Path(run_dir, "config.yaml")])
    train = [r for r in tracking.read_records(Path(run_dir, "metrics.jsonl")) if "lr" in r]
    if not train:
        raise ConfigError(f"lr range test: {run_dir} has no training records")
    lr = np.array([float(r["lr"]) for r in train])
    loss = np.array([float(r["loss"]) for r in train])
    bound, turned, diverged = turning_point(lr, loss)
    return RangeTest(
        str(run_dir), cfg.batch_size, cfg.warmup_lr, cfg.base_lr, bound, turned, diverged
    )


def turning_point(lr: np.ndarray, loss: np.ndarray) -> tuple[float | None, float | None, bool]:
    """(the lr at the smoothed loss's minimum before it first rose to :data:`RISE` times that
    minimum, the lr where it did, whether a loss was not finite); (None, None, False) where the
    smoothed loss never rose so far."""
    finite = np.isfinite(loss)
    diverged = not finite.all()
    n = int(np.argmin(finite)) if diverged else len(loss)
    smooth = ndimage.median_filter(loss[:n], size=SMOOTH, mode="nearest") if n else loss[:0]
    best = np.minimum.accumulate(smooth)
    over = np.flatnonzero(smooth >= RISE * best)
    if over.size:
        t = int(over[0])
        return float(lr[int(np.argmin(smooth[:t]))]), float(lr[t]), diverged
    if diverged:  # no rise before the loss left the numbers (at the first step: the ramp's start)
        return float(lr[int(np.argmin(smooth))] if n else lr[0]), float(lr[n]), True
    return None, None, False


def span(probe_lr: float, probe_batch: int, batch: int) -> tuple[float, float]:
    """The ramp at ``batch``: from the probe's lr to :data:`HIGH` times the linear rule's lr
    through the probe's point (so the test reaches past where Goyal's rule would go)."""
    return probe_lr, HIGH * probe_lr * batch / probe_batch
