"""The gradient noise scale (McCandlish et al. 2018, arXiv:1812.06162): the batch size beyond which a
larger batch stops buying fewer steps.

B_simple = tr(Σ) / |G|², estimated each step from the squared gradient norms at two batch sizes
(:func:`estimate`) and smoothed over steps (:class:`Smoother`). B_big is ``batch_size``; B_small is
``noise_scale_batch`` samples of one process, the last of which :class:`Probe` reads in a DDP
communication hook before the all-reduce. Nothing is written into a gradient, so a run with
``noise_scale=true`` trains to the same digits as without. docs/noise-scale.md has the keys, the
records and the cost."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def estimate(g_small_sq: float, g_big_sq: float, b_small: int, b_big: int) -> tuple[float, float]:
    """(|G|², tr(Σ)): the unbiased estimates from one step's squared norms (eq. A.2), from
    E |G_B|² = |G|² + tr(Σ) / B:

        |G|²  ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
        tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1 / b_small - 1 / b_big)
    return g_sq, trace


def ratio(trace: float, g_sq: float) -> float | None:
    """B_simple = tr(Σ)/|G|², or None where |G|² is not positive (the estimate is then
    meaningless: the gradient is lost in its noise at this batch size)."""
    return trace / g_sq if g_sq > 0 and math.isfinite(trace) else None


@dataclass
class Smoother:
    """Exponential moving averages of the |G|² and tr(Σ) estimates, bias-corrected (the
    average of the first t steps is divided by 1 − decay^t, as Adam's moments)."""

    decay: float
    g_sq: float = 0.0
    trace: float = 0.0
    steps: int = 0

    def update(self, g_sq: float, trace: float) -> None:
        self.g_sq = self.decay * self.g_sq + (1 - self.decay) * g_sq
        self.trace = self.decay * self.trace + (1 - self.decay) * trace
        self.steps += 1

    def value(self) -> tuple[float | None, float | None, float | None]:
        """(|G|², tr(Σ), B_simple), smoothed; None before the first step."""
        if not self.steps:
            return None, None, None
        c = 1 - self.decay**self.steps
        g_sq, trace = self.g_sq / c, self.trace / c
        return g_sq, trace, ratio(trace, g_sq)

    def state_dict(self) -> dict[str, float]:
        return {"g_sq": self.g_sq, "trace": self.trace, "steps": self.steps}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.g_sq, self.trace, self.steps = state["g_sq"], state["trace"], int(state["steps"])


class Probe:
    """Measures one step's |G_small|² (this process's mean over its small batches) and |G_big|²
    without a host read: :meth:`start`, then :meth:`after_backward` after every micro-batch,
    then :meth:`finish` before the optimizer step (and its unscaling) touches the gradients.

    ``params``: the parameters (in a fixed order); ``micro_per_group``: micro-batches per small
    batch; ``accum_steps``: micro-batches per process per step; ``synced``: the last micro-batch's
    backward is all-reduced by DDP (its small batch is then read in the hook, :meth:`wrap`).
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        *,
        micro_per_group: int,
        accum_steps: int,
        b_small: int,
        b_big: int,
        decay: float,
    ) -> None:
        if accum_steps % micro_per_group:
            raise ValueError(
                f"{micro_per_group} micro-batches per small batch do not divide "
                f"{accum_steps} per step"
            )
        self.params = [p for p in params if p.requires_grad]
        self.index = {p.data_ptr(): i for i, p in enumerate(self.params)}
        self.group = micro_per_group
        self.groups = accum_steps // micro_per_group  # small batches per process per step
        self.accum = accum_steps
        self.b_small, self.b_big = b_small, b_big
        self.smoother = Smoother(decay)
        self.prev: list[torch.Tensor] | None = None  # accumulated gradient at the last boundary
        self.active = False
        self._have_prev = False
        self._sums: list[torch.Tensor] = []

    # -- one step ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.active, self._have_prev, self._sums = True, False, []

    def after_backward(self, i: int, synced: bool) -> None:
        """After micro-batch ``i`` (0-based) of the step: at the end of a small batch, add its
        squared norm, unless DDP's hook already read it (``synced``: this backward was
        all-reduced)."""
        if (i + 1) % self.group:
            return
        last = i == self.accum - 1
        if synced and last:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self._sums.append(self._sq_change(grads, self.params))
        if not last:
            if self.prev is None:
                self.prev = [torch.empty_like(g) for g in grads]
            torch._foreach_copy_(self.prev, grads)
            self._have_prev = True

    def finish(self, loss_scale: torch.Tensor | float = 1.0) -> torch.Tensor:
        """[this process's mean |G_small|², |G_big|²] as one float64 tensor on the gradients'
        device, from the (all-reduced) gradients now in ``.grad``, divided by the fp16 loss scale
        squared. No host read."""
        self.active = False
        # a small batch's gradient is the change of the accumulated one (a mean over accum_steps
        # micro-batches) over its micro-batches: its own mean is accum/group times that change
        small = torch.stack(self._sums).sum() * (self.accum / self.group) ** 2 / self.groups
        big = _sq_norm([p.grad for p in self.params if p.grad is not None])
        scale = torch.as_tensor(loss_scale, dtype=torch.float64, device=big.device)
        return torch.stack([small, big]) / scale**2

    def _sq_change(self, grads: list[torch.Tensor], params: list[torch.Tensor]) -> torch.Tensor:
        if not self._have_prev:
            return _sq_norm(grads)
        prev = [self.prev[self.index[p.data_ptr()]] for p in params]
        return _sq_norm(torch._foreach_sub(grads, prev))

    # -- DDP --------------------------------------------------------------------------------------

    def wrap(self, hook: Callable) -> Callable:
        """A DDP communication hook that reads the bucket's local gradients (the last small batch:
        their change since the last boundary) before ``hook`` reduces them."""

        def noise_scale_hook(state, bucket):
            if self.active:
                self._sums.append(self._sq_change(bucket.gradients(), bucket.parameters()))
            return hook(state, bucket)

        return noise_scale_hook

    # -- after the flush's all-reduce (host values) -----------------------------------------------

    def record(self, g_small_sq: float, g_big_sq: float) -> dict[str, float | None]:
        """One step's ``gns_*`` fields of metrics.jsonl (W&B: the same names, one point per flush);
        smooths its estimates unless they are not finite (an fp16 step whose gradients
        overflowed, and was skipped)."""
        g_sq, trace = estimate(g_small_sq, g_big_sq, self.b_small, self.b_big)
        finite = all(math.isfinite(v) for v in (g_small_sq, g_big_sq))
        if finite:
            self.smoother.update(g_sq, trace)
        g_sq_ema, trace_ema, b_ema = self.smoother.value()
        return {
            "gns_g_small_sq": g_small_sq,
            "gns_g_big_sq": g_big_sq,
            "gns_g_sq": g_sq,
            "gns_trace": trace,
            "gns_b_simple": ratio(trace, g_sq) if finite else None,
            "gns_g_sq_ema": g_sq_ema,
            "gns_trace_ema": trace_ema,
            "gns_b_simple_ema": b_ema,
            "gns_b_small": self.b_small,
            "gns_b_big": self.b_big,
        }


def _sq_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Σ |t|² over the tensors, in float64 (one fused norm kernel per dtype and device)."""
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    norms = torch._foreach_norm(list(tensors))
    return torch.stack(norms).double().square().sum()


def exact(per_sample_grads: torch.Tensor) -> tuple[float, float, float]:
    """(|G|², tr(Σ), tr(Σ)/|G|²) of a whole train split from its per-sample gradients (one row
    per sample), Σ the sample covariance (normalised by N − 1): what the smoothed estimate of
    a fixed model converges to. lbsgd samples without replacement, so :func:`estimate`'s tr(Σ)
    has expectation N/(N − 1) times the population trace: exactly this one."""
    g = per_sample_grads.double()
    mean = g.mean(0)
    g_sq = float(mean.square().sum())
    trace = float((g - mean).square().sum() / (len(g) - 1))
    return g_sq, trace, trace / g_sq
