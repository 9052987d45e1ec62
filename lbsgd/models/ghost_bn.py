"""Ghost BatchNorm: BN statistics over groups of exactly ``bn_batch`` samples, whatever the layout.

Goyal et al. 2017 §2.3 ("Batch Normalization"): BN's loss is defined per group of n samples, so the
minibatch of kn samples is k independent BN groups of n; changing n changes the function being
optimised. The paper keeps n = 32 per GPU on any number of GPUs and simulates larger k on one
server "with gradient accumulation" over groups of n. Here the group is a config key (``bn_batch``),
so a run with batch 65536 and n = 32 has the same mathematics on 1 process accumulating 2048
micro-batches of 32, on 1 process with micro-batches of 256 (8 groups each), or on 2048 processes.

Training-mode forward: the micro-batch of m = g·n samples (g groups of consecutive samples) is
normalised group by group. The groups are folded into channels, ``(g·n, C, …) → (n, g·C, …)``, so
one native ``batch_norm`` call computes all g·C statistics (with γ and β repeated g times); for
g = 1 no copy is made. Evaluation uses the running statistics as usual.

Running statistics (the decision this module makes, so that the layout never shows):
every group's mean and unbiased variance are summed during the forward passes of an optimizer
step; after the step, :class:`RunningStats` adds the sums over all processes (one small
all-reduce for the whole network) and updates, with the G = kn/n group averages μ̄ and σ̄²,

    running ← (1 − m)^G · running + (1 − (1 − m)^G) · average,     m = BN momentum (0.1)

i.e. as if each of the step's G groups had updated the running statistics in turn (PyTorch's
per-forward rule), with every group contributing the step's average. The result depends only on
the global batch and n, never on how groups are spread over processes and micro-batches; BN
buffers are therefore equal on every rank and DDP need not broadcast them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


class GhostBatchNorm(_BatchNorm):
    """Drop-in for ``nn.BatchNorm{1,2,3}d`` (same parameters, buffers and state_dict keys)."""

    def __init__(self, num_features: int, group_size: int, eps: float = 1e-5,
                 momentum: float = 0.1, affine: bool = True) -> None:  # fmt: skip
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine)
        if group_size < 1:
            raise ValueError(f"bn_batch={group_size} must be >= 1")
        self.group_size = group_size
        # Sums over the groups seen since the last commit (not saved: zero at every step boundary)
        self.register_buffer("group_mean_sum", torch.zeros(num_features), persistent=False)
        self.register_buffer("group_var_sum", torch.zeros(num_features), persistent=False)

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"

    def forward(self, x: Tensor) -> Tensor:
        self._check_input_dim(x)
        if not self.training:
            return super().forward(x)
        n, c = self.group_size, self.num_features
        batch = x.shape[0]
        if batch % n:
            raise RuntimeError(f"micro-batch of {batch} is not a multiple of bn_batch={n}")
        g = batch // n
        rest = x.shape[2:]
        xg = x if g == 1 else x.reshape(g, n, c, *rest).transpose(0, 1).reshape(n, g * c, *rest)
        # momentum=1 turns the "running" arguments into outputs: the group means and unbiased
        # variances, computed by the same kernel that normalises.
        mean = torch.zeros(g * c, device=x.device, dtype=torch.float32)
        var = torch.ones(g * c, device=x.device, dtype=torch.float32)
        weight = self.weight if g == 1 or self.weight is None else self.weight.repeat(g)
        bias = self.bias if g == 1 or self.bias is None else self.bias.repeat(g)
        y = F.batch_norm(xg, mean, var, weight, bias, True, 1.0, self.eps)
        if g > 1:
            y = y.reshape(n, g, c, *rest).transpose(0, 1).reshape(batch, c, *rest)
        with torch.no_grad():  # .add_ on the buffer itself: no Module.__setattr__ per forward
            self.group_mean_sum.add_(mean if g == 1 else mean.view(g, c).sum(0))
            self.group_var_sum.add_(var if g == 1 else var.view(g, c).sum(0))
        return y


def convert(model: nn.Module, group_size: int) -> nn.Module:
    """Replace every BatchNorm{1,2,3}d of ``model`` (in place) with a GhostBatchNorm, keeping its
    parameters and buffers. Returns the model."""
    for name, child in model.named_children():
        if type(child) in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
            if not child.track_running_stats:
                raise ValueError(f"{name}: BN without running statistics is not supported")
            ghost = GhostBatchNorm(child.num_features, group_size, child.eps,
                                   child.momentum if child.momentum is not None else 0.1,
                                   child.affine)  # fmt: skip
            ghost.load_state_dict(child.state_dict())
            ghost.to(device=child.running_mean.device)
            ghost.train(child.training)
            setattr(model, name, ghost)
        else:
            convert(child, group_size)
    return model


def ghost_modules(model: nn.Module) -> list[GhostBatchNorm]:
    return [m for m in model.modules() if isinstance(m, GhostBatchNorm)]


class RunningStats:
    """Folds the group statistics of one optimizer step into the running statistics.

    ``groups`` is G = batch_size / bn_batch, the number of BN groups in a global batch (fixed by
    the config). ``all_reduce_sum`` adds a tensor over the processes; None for one process.
    """

    def __init__(self, modules: list[GhostBatchNorm], groups: int,
                 all_reduce_sum: Callable[[Tensor], Tensor] | None = None) -> None:  # fmt: skip
        if groups < 1:
            raise ValueError(f"groups={groups} must be >= 1")
        self.groups = groups
        self.all_reduce_sum = all_reduce_sum
        # one list per momentum value: a foreach update each (all 0.1 in practice)
        self.by_momentum: dict[float, list[GhostBatchNorm]] = {}
        for m in modules:
            self.by_momentum.setdefault(float(m.momentum), []).append(m)
        self.sums = [t for m in modules for t in (m.group_mean_sum, m.group_var_sum)]

    def commit(self) -> None:
        if not self.sums:
            return
        if self.all_reduce_sum is not None:  # one collective for the whole network
            flat = self.all_reduce_sum(torch.cat(self.sums))
            torch._foreach_copy_(self.sums, list(flat.split([t.numel() for t in self.sums])))
        with torch.no_grad():
            for momentum, mods in self.by_momentum.items():
                keep = (1.0 - momentum) ** self.groups  # G sequential updates with the average
                running = [t for m in mods for t in (m.running_mean, m.running_var)]
                sums = [t for m in mods for t in (m.group_mean_sum, m.group_var_sum)]
                torch._foreach_mul_(running, keep)
                torch._foreach_add_(running, sums, alpha=(1.0 - keep) / self.groups)
                torch._foreach_add_([m.num_batches_tracked for m in mods], 1)
            torch._foreach_zero_(self.sums)
