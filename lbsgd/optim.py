"""Optimizers. The learning rate is set every iteration from :mod:`lbsgd.schedules`.

``optimizer=sgd`` is PyTorch's SGD: v ← m·v + (g + λ·w); w ← w − η_t·v (Nesterov: w ← w − η_t·(g + λ·w
+ m·v)). With the learning rate outside the velocity this is the form of Goyal et al. 2017 §3,
eq. (10) *with* momentum correction applied implicitly: a change of η_t takes effect at once and
the velocity needs no rescaling.
"""

from __future__ import annotations

import torch

from lbsgd.config import Config


def build(cfg: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.SGD(
        params,
        lr=cfg.base_lr,  # overwritten before every step by set_lr
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
