"""The learning rate as a pure function of the iteration (the only place lbsgd computes one).

Goyal et al. 2017 §2.1–2.2: warmup ``none``, ``constant`` or ``gradual`` (linear per iteration,
never per epoch, from warmup_lr to the peak lr of :func:`lbsgd.config.derive`), then a ``step``,
``poly`` or ``cosine`` decay evaluated every iteration."""

from __future__ import annotations

import math

from lbsgd.config import Config, Derived


def learning_rate(step: int, c: Config, d: Derived) -> float:
    """Learning rate of iteration ``step`` (0-based: the lr used by the ``step+1``-th update).

    With η̂ the peak lr, w the warmup steps and T the total: constant warmup gives warmup_lr and
    gradual warmup_lr + (η̂ − warmup_lr)·t/w for t < w; then step gives η̂·decay_factor^(milestones
    reached, counted from iteration 0), poly η̂·(1 − (t − w)/(T − w))^poly_power and cosine
    η̂·½(1 + cos(π(t − w)/(T − w))).
    """
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    w = d.warmup_steps
    if step < w:
        if c.warmup == "constant":
            return d.warmup_start_lr
        return d.warmup_start_lr + (d.lr - d.warmup_start_lr) * step / w  # gradual
    if c.schedule == "step":
        reached = sum(1 for m in d.milestone_steps if step >= m)
        return d.lr * c.decay_factor**reached
    span = max(1, d.total_steps - w)
    progress = min(1.0, (step - w) / span)
    if c.schedule == "poly":
        return d.lr * (1.0 - progress) ** c.poly_power
    return d.lr * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine
