"""Ghost BatchNorm: BN statistics over groups of exactly ``bn_batch`` samples, whatever the layout.

BN's loss is defined per group of n samples (Goyal et al. 2017 §2.3), so the group is a key and a
run has the same mathematics on one process accumulating micro-batches or on many processes.
:class:`OnePassBatchNorm` normalises a micro-batch of g groups in one pass over a (g, n, C, …) view,
in fp32 statistics, keeping the input's memory format; g = 1 is one plain ``F.batch_norm`` call.
:class:`RunningStats` sums every group's statistics over an optimizer step and all processes (one
small all-reduce) and updates the running statistics once, as if each of the step's G groups had
updated them in turn: running ← (1 − m)^G · running + (1 − (1 − m)^G) · average. BN buffers are
thus equal on every rank and independent of the layout. Speeds: docs/times.md."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


class GhostBatchNorm(_BatchNorm):
    """Drop-in for ``nn.BatchNorm{1,2,3}d`` (same parameters, buffers and state_dict keys)."""

    # the function normalising two or more groups (None: OnePassBatchNorm); lbsgd bench ghost-bn
    # times the per-group loop in its place
    kernel: type[torch.autograd.Function] | None = None

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
        else:
            kernel = self.kernel or OnePassBatchNorm
            y = kernel.apply(x, self.weight, self.bias, stats, n, self.eps)
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


def _reduced(xg: Tensor) -> list[int]:
    """The dimensions of a (g, n, C, …) view that a group's statistics run over: n and the rest."""
    return [1, *range(3, xg.dim())]


def _per_channel(t: Tensor, xg: Tensor) -> Tensor:
    return t.view(1, 1, -1, *[1] * (xg.dim() - 3))


_NONE = 0  # mse_loss's reduction 'none' (torch.nn._reduction.get_enum)


def _per_sample(t: Tensor, n: int) -> Tensor:
    """A (g, 1, C, 1, …) per-group term spread over the g·n samples: (g·n, C, 1, …)."""
    return t.expand(-1, n, *t.shape[2:]).flatten(0, 1)


def _squares(xg: Tensor, mean: Tensor, out: Tensor | None) -> Tensor:
    """(x − μ)² in fp32, in one fused pass: ``mse_loss`` without reduction is exactly that
    elementwise kernel (it broadcasts μ, and a low-precision x is promoted to μ's fp32 before the
    difference). An fp32 input's is written into ``out`` (the output's buffer, overwritten after),
    so no fresh temporary the size of the activations is made (on a CPU its first-touched pages
    cost more than the arithmetic); a low-precision input's is a new fp32 tensor, and so is any
    input's under torch.compile (no buffer: the compiler fuses it into the reduction)."""
    if out is not None and out.dtype == torch.float32:
        return torch._C._nn.mse_loss(xg, mean, _NONE, out=out)  # F.mse_loss's own binding
    return torch._C._nn.mse_loss(xg, mean, _NONE)


def _products(xg: Tensor, mean: Tensor, dy: Tensor, out: Tensor | None) -> tuple[Tensor, float]:
    """(x − μ)·dy in fp32 times a factor, and the factor's inverse: ``mse_loss``'s backward without
    reduction, 2·(x − μ)·dy in one fused pass computed in its output's fp32 (×2 is exact, so half
    its sum is Σ (x − μ)·dy bit for bit). The output is ``out`` (the gradient's buffer) for fp32
    tensors, else a new fp32 tensor in x's layout; under torch.compile (no buffer) the plain
    product, which the compiler fuses into the reduction."""
    if out is None:
        return torch.sub(xg, mean).mul_(dy), 1.0
    if out.dtype != torch.float32 or dy.dtype != torch.float32:
        out = torch.empty_like(xg, dtype=torch.float32)
    two = torch.ops.aten.mse_loss_backward.grad_input(dy, xg, mean, _NONE, grad_input=out)
    return two, 0.5


class OnePassBatchNorm(torch.autograd.Function):
    """Batch norm of every group of n consecutive samples at once: two reductions for all groups'
    statistics, one fused pass to normalise; backward, two reductions and two fused passes.

    With μ, σ² a group's mean and biased variance over its n samples and the spatial positions
    (M values a channel), x̂ = (x − μ)/√(σ² + ε), y = γ x̂ + β, and per group and channel

        dx = γ/√(σ² + ε) · (dy − Σdy/M − x̂ · Σ(dy·x̂)/M),   dγ = Σ_groups Σ(dy·x̂),   dβ = Σ_groups Σdy

    (the derivative of batch norm, group by group). ``stats`` receives each group's mean and
    unbiased variance (σ² M/(M − 1)), as ``native_batch_norm`` with momentum 1 writes them."""

    @staticmethod
    def forward(ctx, x, weight, bias, stats, n, eps):
        g = x.shape[0] // n
        shape = (g, n, *x.shape[1:])
        xg = x.view(shape)
        dims, count = _reduced(xg), n * math.prod(x.shape[2:])
        # the output (the input's memory format; not a view: a ReLU may work in place), whose
        # buffer takes the squares first; compiled, none: the compiler plans the buffers
        y = None if torch.compiler.is_compiling() else torch.empty_like(x)
        out = None if y is None else y.view(shape)
        # two passes, as the native kernels: the mean, then the squares about it (no cancellation),
        # in fp32 whatever the activations' precision (squares not rounded to 8 bits)
        mean = xg.mean(dims, keepdim=True, dtype=torch.float32)
        var = _squares(xg, mean, out).mean(dims, keepdim=True)
        unbiased = var * (count / max(count - 1, 1))
        torch.stack((mean, unbiased), out=stats.view(2, *mean.shape))
        invstd = var.add_(eps).rsqrt_()
        scale = invstd if weight is None else invstd * _per_channel(weight, xg)
        shift = (
            mean * -scale
            if bias is None
            else torch.addcmul(_per_channel(bias, xg), mean, scale, value=-1)
        )
        if y is None:  # one pass: x·scale + shift
            y = torch.addcmul(_per_sample(shift, n), x, _per_sample(scale, n)).to(x.dtype)
        else:
            torch.addcmul(shift, xg, scale, out=out)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.shape, ctx.count = shape, count
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, mean, invstd = ctx.saved_tensors
        shape, m = ctx.shape, ctx.count
        xg, dy = x.view(shape), grad_y.reshape(shape)
        dims = _reduced(xg)
        grad_x = None if torch.compiler.is_compiling() else torch.empty_like(x)
        out = None if grad_x is None else grad_x.view(shape)
        sum_dy = dy.sum(dims, keepdim=True, dtype=torch.float32)
        products, inverse = _products(xg, mean, dy, out)
        dot = products.sum(dims, keepdim=True).mul_(invstd * inverse)  # Σ dy·x̂
        a = invstd if weight is None else invstd * _per_channel(weight, xg)
        # dx = a·dy + k·x + b: the formula above with x̂ = (x − μ)·invstd expanded
        k = torch.mul(a, invstd).mul_(dot).div_(-m)
        b = torch.mul(k, mean).neg_().sub_(torch.mul(a, sum_dy).div_(m))
        if grad_x is None:
            n = shape[1]
            grad_x = torch.addcmul(_per_sample(b, n), grad_y, _per_sample(a, n))
            grad_x = grad_x.addcmul_(x, _per_sample(k, n)).to(x.dtype)
        else:
            torch.addcmul(b, dy, a, out=out).addcmul_(xg, k)
        if weight is None:
            return grad_x, None, None, None, None, None
        return grad_x, dot.sum(0).view(-1), sum_dy.sum(0).view(-1), None, None, None


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
