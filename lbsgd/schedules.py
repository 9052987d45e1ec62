"""The learning rate as a pure function of the iteration (the only place lbsgd computes one).

Goyal et al. 2017 §2.1–2.2, with eta = base_lr and eta-hat = the peak lr of :func:`lbsgd.config.derive`
(eta-hat = k·eta under the linear rule for a batch k times reference_batch):

- warmup=none:     eta-hat from the first iteration.
- warmup=constant: warmup_lr for the first ``warmup_steps`` iterations, then eta-hat (§2.2,
  "constant warmup"; the training error spikes when it switches).
- warmup=gradual:  warmup_lr + (eta-hat − warmup_lr)·t / warmup_steps for t < warmup_steps, i.e. "a
  constant amount at each iteration such that it reaches eta-hat after 5 epochs" (§2.2). Per
  iteration, never per epoch: at kn=8192 five epochs are ~782 iterations, not five jumps.

After the warmup the decay is evaluated every iteration:
- step:   eta-hat · decay_factor^(number of milestones reached); milestones count from iteration 0,
          as in Goyal's ÷10 at epochs 30, 60 and 80.
- poly:   eta-hat · (1 − (t − w)/(T − w))^poly_power over the iterations after the warmup (You et al.
          2017 use power 2 with LARS).
- cosine: eta-hat · ½(1 + cos(π (t − w)/(T − w))).
"""

from __future__ import annotations

import math

from lbsgd.config import Config, Derived


def learning_rate(step: int, c: Config, d: Derived) -> float:
    """Learning rate of iteration ``step`` (0-based: the lr used by the ``step+1``-th update)."""
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
