"""Ghost BatchNorm: BN statistics over groups of exactly ``bn_batch`` samples, whatever the layout.

Goyal et al. 2017 §2.3 ("Batch Normalization"): BN's loss is defined per group of n samples, so the
minibatch of kn samples is k independent BN groups of n; changing n changes the function being
optimised. The paper keeps n = 32 per GPU on any number of GPUs and simulates larger k on one
server "with gradient accumulation" over groups of n. Here the group is a config key (``bn_batch``),
so a run with batch 65536 and n = 32 has the same mathematics on 1 process accumulating 2048
micro-batches of 32, on 1 process with micro-batches of 256 (8 groups each), or on 2048 processes.

Training-mode forward: the micro-batch of m = g·n samples (g groups of consecutive samples) is
normalised group by group, each group by one native ``native_batch_norm`` call on its contiguous
slice of the micro-batch, written straight into its slice of one output tensor (and, backwards, of
one input gradient): no copy of the activations, and a channels_last input (each slice of which is
itself channels_last) gives a channels_last output, so the next convolution stays on its fast path.
With momentum 1 the "running" arguments of each call are outputs: the group's mean and unbiased
variance, computed by the kernel that normalises. g = 1 is one plain ``F.batch_norm`` call; under
``torch.compile`` the groups are folded into channels, ``(g·n, C, …) → (n, g·C, …)``, which the
compiler fuses. Evaluation uses the running statistics as usual.

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

    def __init__(
        self,
        num_features: int,
        group_size: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
    ) -> None:
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine)
        if group_size < 1:
            raise ValueError(f"bn_batch={group_size} must be >= 1")
        self.group_size = group_size
        # Sums over the groups seen since the last commit (not saved: zero at every step boundary)
        # (group_mean_sum, group_var_sum) rows: one tensor, so one kernel adds a forward's groups
        self.register_buffer("group_sums", torch.zeros(2, num_features), persistent=False)
        self._stats: Tensor | None = None

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"

    def forward(self, x: Tensor) -> Tensor:
        self._check_input_dim(x)
        if not self.training:
            return super().forward(x)
        n = self.group_size
        if x.shape[0] % n:
            raise RuntimeError(f"micro-batch of {x.shape[0]} is not a multiple of bn_batch={n}")
        g = x.shape[0] // n
        stats = self._scratch(g, x.device)  # (2, g, C): each group's mean and unbiased variance
        if g == 1:
            y = F.batch_norm(
                x, stats[0, 0], stats[1, 0], self.weight, self.bias, True, 1.0, self.eps
            )
        elif torch.compiler.is_compiling():
            y = folded(x, self.weight, self.bias, stats, n, self.eps)
        else:
            y = GroupedBatchNorm.apply(x, self.weight, self.bias, stats, n, self.eps)
        with torch.no_grad():  # in place on the buffer: no Module.__setattr__ per forward
            self.group_sums.add_(stats[:, 0] if g == 1 else stats.sum(1))
        return y

    def _scratch(self, groups: int, device: torch.device) -> Tensor:
        """Where the kernels write the group statistics: allocated once per group count and
        reused (momentum 1 overwrites it; zeros at first, so no 0 · garbage = NaN)."""
        t = self._stats
        if t is None or t.shape[1] != groups or t.device != device:
            t = self._stats = torch.zeros(2, groups, self.num_features, device=device)
        return t

    @property
    def group_mean_sum(self) -> Tensor:
        return self.group_sums[0]

    @property
    def group_var_sum(self) -> Tensor:
        return self.group_sums[1]


def folded(x: Tensor, weight, bias, stats: Tensor, n: int, eps: float) -> Tensor:
    """Ghost BN as one batch_norm over g·C channels (copies through transposes; for compilers)."""
    batch, c, rest = x.shape[0], x.shape[1], x.shape[2:]
    g = batch // n
    xg = x.reshape(g, n, c, *rest).transpose(0, 1).reshape(n, g * c, *rest)
    mean, var = torch.zeros(g * c, device=x.device), torch.ones(g * c, device=x.device)
    w = None if weight is None else weight.repeat(g)
    b = None if bias is None else bias.repeat(g)
    y = F.batch_norm(xg, mean, var, w, b, True, 1.0, eps)
    stats.copy_(torch.stack([mean.view(g, c), var.view(g, c)]))
    return y.reshape(n, g, c, *rest).transpose(0, 1).reshape(batch, c, *rest)


def _memory_format(x: Tensor) -> torch.memory_format:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last if not x.is_contiguous() else torch.contiguous_format
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d if not x.is_contiguous() else torch.contiguous_format
    return torch.contiguous_format


class GroupedBatchNorm(torch.autograd.Function):
    """One native batch-norm kernel per group of n samples, forward and backward, each reading
    and writing its own slice of shared tensors (no gather, no concatenation)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stats, n, eps):
        x = x.contiguous(memory_format=_memory_format(x))
        g = x.shape[0] // n
        y = torch.empty_like(x)
        save = torch.empty(2, g, x.shape[1], device=x.device, dtype=torch.float32)
        # views made once per call (split/unbind), not per group: the loop is the hot path
        outs = zip(y.split(n), save[0].unbind(), save[1].unbind(), strict=True)
        groups = zip(x.split(n), stats[0].unbind(), stats[1].unbind(), strict=True)
        for (xi, mean, var), out in zip(groups, outs, strict=True):
            torch.native_batch_norm(xi, weight, bias, mean, var, True, 1.0, eps, out=out)
        ctx.save_for_backward(x, weight, save)
        ctx.n, ctx.eps = n, eps
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, save = ctx.saved_tensors
        n = ctx.n
        grad_y = grad_y.contiguous(memory_format=_memory_format(x))
        mask = [True, weight is not None, weight is not None]
        parts = zip(grad_y.split(n), x.split(n), save[0].unbind(), save[1].unbind(), strict=True)
        grads = [
            torch.ops.aten.native_batch_norm_backward(
                gy, xi, weight, None, None, mean, invstd, True, ctx.eps, mask
            )
            for gy, xi, mean, invstd in parts
        ]
        # (the out= variant of the backward computes, then copies: one cat is one copy)
        grad_x = torch.cat([gi[0] for gi in grads]).contiguous(memory_format=_memory_format(x))
        if weight is None:
            return grad_x, None, None, None, None, None
        grad_w = torch.stack([gi[1] for gi in grads]).sum(0)
        grad_b = torch.stack([gi[2] for gi in grads]).sum(0)
        return grad_x, grad_w, grad_b, None, None, None


def convert(model: nn.Module, group_size: int) -> nn.Module:
    """Replace every BatchNorm{1,2,3}d of ``model`` (in place) with a GhostBatchNorm, keeping its
    parameters and buffers. Returns the model."""
    for name, child in model.named_children():
        if type(child) in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
            if not child.track_running_stats:
                raise ValueError(f"{name}: BN without running statistics is not supported")
            ghost = GhostBatchNorm(
                child.num_features,
                group_size,
                child.eps,
                child.momentum if child.momentum is not None else 0.1,
                child.affine,
            )
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

    def __init__(
        self,
        modules: list[GhostBatchNorm],
        groups: int,
        all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        if groups < 1:
            raise ValueError(f"groups={groups} must be >= 1")
        self.groups = groups
        self.all_reduce_sum = all_reduce_sum
        # one list per momentum value: a foreach update each (all 0.1 in practice)
        self.by_momentum: dict[float, list[GhostBatchNorm]] = {}
        for m in modules:
            self.by_momentum.setdefault(float(m.momentum), []).append(m)
        self.sums = [m.group_sums for m in modules]
        # the lists each commit works on, made once (buffers are not replaced after this point)
        self.updates = [
            (
                (1.0 - momentum) ** groups,  # keep: G sequential updates with the average
                [t for m in mods for t in (m.running_mean, m.running_var)],
                [t for m in mods for t in m.group_sums.unbind()],
                [m.num_batches_tracked for m in mods],
            )
            for momentum, mods in self.by_momentum.items()
        ]
        self.modules = modules

    def commit(self) -> None:
        if not self.sums:
            return
        if self.all_reduce_sum is not None:  # one collective for the whole network
            flat = self.all_reduce_sum(torch.cat([t.flatten() for t in self.sums]))
            parts = flat.split([t.numel() for t in self.sums])
            torch._foreach_copy_(
                self.sums, [p.view_as(t) for p, t in zip(parts, self.sums, strict=True)]
            )
        with torch.no_grad():
            for keep, running, sums, counts in self.updates:
                torch._foreach_mul_(running, keep)
                torch._foreach_add_(running, sums, alpha=(1.0 - keep) / self.groups)
                torch._foreach_add_(counts, 1)
            torch._foreach_zero_(self.sums)
            # a non-finite statistic would survive momentum 1 (0 · inf = NaN): start clean
            scratch = [m._stats for m in self.modules if m._stats is not None]
            if scratch:
                torch._foreach_zero_(scratch)
