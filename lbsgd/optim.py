"""Optimizers of the replayed studies: SGD with the lr inside the velocity, LARS, LAMB and AdamW.

The learning rate is set every iteration from :mod:`lbsgd.schedules` through :func:`set_lr`,
before ``optimizer.step()``. Each class states its paper's update; docs/recipes.md has them side by
side. With ``decay_bn_bias=false`` the parameters of normalisation layers and every tensor with
ndim <= 1 (biases) get neither weight decay nor a LARS or LAMB trust ratio (Jia et al. 2018),
chosen by module type and tensor shape, never by parameter name."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from lbsgd.config import Config, optimizers

# Modules whose parameters are scale/shift of a normalisation (BN γ/β and its relatives).
NORM_TYPES: tuple[type[nn.Module], ...] = (
    _BatchNorm,  # BatchNorm1d/2d/3d, SyncBatchNorm, lbsgd's GhostBatchNorm
    nn.GroupNorm,
    nn.LayerNorm,
    _InstanceNorm,
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def _undecorated(name: str) -> Callable:
    """torch.optim.Optimizer's method ``name`` without its ``torch._disable_dynamo`` wrapper (what
    functools.wraps keeps as ``__wrapped__``), or as it is where torch does not wrap it."""
    method = getattr(torch.optim.Optimizer, name)
    return getattr(method, "__wrapped__", method)


class _PerGroup(torch.optim.Optimizer):
    """The loop every optimizer here shares: per group, the parameters that have a gradient (dense
    only) go to :meth:`_group_step`.

    torch marks four of Optimizer's methods not to be traced by torch.compile; the marker's first
    call imports torch._dynamo, about 2.3 s of CPU at every run's start. lbsgd calls them outside
    any compiled region (``compile`` compiles the model only), so they are called unmarked here.
    """

    add_param_group = _undecorated("add_param_group")
    zero_grad = _undecorated("zero_grad")
    state_dict = _undecorated("state_dict")
    load_state_dict = _undecorated("load_state_dict")

    def _group_step(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]):
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if any(g.is_sparse for g in grads):
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            self._group_step(group, params, grads)
        return loss


class _VelocitySGD(_PerGroup):
    """The velocity update shared by SGD and LARS (lr inside the velocity, Goyal §3).

    A group stores ``last_lr``, the lr of its previous step, so that ``state_dict()`` carries it and
    a resumed run applies the same momentum correction as an uninterrupted one. Velocities are
    ``state[p]["momentum_buffer"]``, in units of the parameter (they include the lr).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        momentum_correction: bool = True,
        **defaults: Any,
    ) -> None:
        if not lr >= 0:
            raise ValueError(f"lr={lr} must be >= 0")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum={momentum} must be in [0, 1)")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay={weight_decay} must be >= 0")
        if nesterov and momentum <= 0:
            raise ValueError(f"nesterov=True needs momentum > 0, got momentum={momentum}")
        # last_lr: the lr of the group's previous step (None before the first), read by the
        # correction
        velocity = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "momentum_correction": momentum_correction,
            "last_lr": None,
        }
        super().__init__(params, {**velocity, **defaults})  # LARS's keys after these

    def _directions(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]):
        """(d, alpha): the step before momentum is alpha·d. Subclasses say what d is."""
        raise NotImplementedError

    def _group_step(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]):
        lr, m = group["lr"], group["momentum"]
        d, alpha = self._directions(group, params, grads)
        if m == 0:
            torch._foreach_add_(params, d, alpha=-alpha)
        else:
            bufs = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    # v_0 = 0: the first step is alpha·d, exactly PyTorch's first step.
                    state["momentum_buffer"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format
                    )
                bufs.append(state["momentum_buffer"])
            last = group.get("last_lr")
            # Goyal eq. (10): v was built with lr η_t; rescale it to η_{t+1}. When η_t = 0 the
            # corrected velocity is already 0 (v = m·0·v + 0·d), so there is nothing to rescale
            # and no ratio exists: the lr-inside form cannot carry a velocity through η = 0.
            ratio = lr / last if group["momentum_correction"] and last else 1.0
            torch._foreach_mul_(bufs, m * ratio)
            torch._foreach_add_(bufs, d, alpha=alpha)
            if group["nesterov"]:
                torch._foreach_add_(params, d, alpha=-alpha)
                torch._foreach_add_(params, bufs, alpha=-m)
            else:
                torch._foreach_sub_(params, bufs)
        # Params with grad None in this step keep their velocity unscaled (grads are dense in
        # lbsgd, so every parameter steps every iteration).
        group["last_lr"] = lr


class SGD(_VelocitySGD):
    """SGD with momentum, the learning rate inside the velocity (Goyal et al. 2017 §3, eq. 10).

    v ← m·(η_{t+1}/η_t)·v + η_{t+1}·(g + λ·w);  w ← w − v   (Nesterov: w ← w − (η·(g + λ·w) + m·v)).
    With ``momentum_correction=False`` the factor η_{t+1}/η_t is 1.
    """

    @classmethod
    def from_config(cls, groups: list[dict[str, Any]], cfg: Config) -> SGD:
        for g in groups:
            g.pop("adapt", None)  # SGD never adapts; keep its groups free of a key it would ignore
        return cls(groups, **_velocity_keys(cfg))

    def _directions(self, group, params, grads):
        wd = group["weight_decay"]
        d = torch._foreach_add(grads, params, alpha=wd) if wd != 0 else grads  # g + λ·w
        return d, group["lr"]


def lars_trust_ratio(w_norm: Tensor, g_norm: Tensor, eta: float, weight_decay: float) -> Tensor:
    """You et al. 2017 Algorithm 1: λ = η·‖w‖ / (‖g‖ + β·‖w‖), elementwise over tensors of norms.

    λ = 1 where ‖w‖ = 0 or ‖g‖ = 0 (as timm and NVIDIA's LARC): a zero-initialised tensor (a γ=0
    BN weight under decay_bn_bias=true, Goyal §5.3) would otherwise get λ = 0 and never move, and
    ‖g‖ = 0 with β = 0 would give 0/0. With λ = 1 the step is plain SGD(+decay) for that tensor.
    """
    ratio = eta * w_norm / (g_norm + weight_decay * w_norm)
    return torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))


def _norms(tensors: list[Tensor]) -> Tensor:
    """‖t‖₂ of each tensor as one vector, accumulated in fp32 at least (fp16 squares overflow at
    256), in one ``_foreach_norm`` launch and without a host sync."""
    low = any(t.dtype in (torch.float16, torch.bfloat16) for t in tensors)
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32 if low else None))


class LARS(_VelocitySGD):
    """Layer-wise Adaptive Rate Scaling, You et al. 2017 Algorithm 1 (the form of Jia et al. 2018).

    v ← m·(γ_{t+1}/γ_t)·v + γ_{t+1}·λ·(g + β·w);  w ← w − v, with λ of :func:`lars_trust_ratio`
    per parameter tensor. A group with ``adapt=False`` uses λ = 1 (with weight_decay=0 that is
    v ← m·v + γ·g: the bias/BN group of Jia et al.). Norms are taken in fp32 with one
    ``_foreach_norm`` per group and the ratios stay on the device: no host sync per tensor.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        momentum_correction: bool = True,
        trust_coefficient: float = 0.001,
        adapt: bool = True,
    ) -> None:
        if not trust_coefficient > 0:
            raise ValueError(f"trust_coefficient={trust_coefficient} (lars_eta) must be > 0")
        super().__init__(
            params,
            lr,
            momentum,
            weight_decay,
            nesterov,
            momentum_correction,
            trust_coefficient=trust_coefficient,
            adapt=adapt,
        )

    @classmethod
    def from_config(cls, groups: list[dict[str, Any]], cfg: Config) -> LARS:
        return cls(groups, trust_coefficient=cfg.lars_eta, **_velocity_keys(cfg))

    def _directions(self, group, params, grads):
        lr, wd = group["lr"], group["weight_decay"]
        d = torch._foreach_add(grads, params, alpha=wd) if wd != 0 else grads  # g + β·w
        if not group["adapt"]:
            return d, lr
        w_norm, g_norm = _norms(params), _norms(grads)
        local = lr * lars_trust_ratio(w_norm, g_norm, group["trust_coefficient"], wd)  # γ·λ
        # Out of place: p.grad itself is left as the backward pass wrote it.
        return torch._foreach_mul(d, list(local.unbind())), 1.0


def lamb_trust_ratio(w_norm: Tensor, u_norm: Tensor) -> Tensor:
    """You et al. 2019 Algorithm 2: ‖w‖ / ‖u‖ with u = r + λ·w, elementwise over tensors of norms.

    1 where ‖w‖ = 0 or ‖u‖ = 0 (as timm's Lamb and NVIDIA's FusedLAMB): a zero-initialised tensor
    would otherwise never move, and ‖u‖ = 0 would give 0/0.
    """
    ratio = w_norm / u_norm
    return torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))


class _Adam(_PerGroup):
    """Adam's bias-corrected moments with weight decay inside the step (You et al. 2019 Alg. 2),
    and LAMB's layer-wise trust ratio on the groups with ``adapt=True``.

    A group counts its steps in ``step`` (an int, so that ``state_dict()`` carries it and a resumed
    run bias-corrects exactly as an uninterrupted one); the moments are ``state[p]["exp_avg"]`` and
    ``state[p]["exp_avg_sq"]``. Norms are taken as LARS's (:func:`_norms`).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adapt: bool = True,
    ) -> None:
        if not lr >= 0:
            raise ValueError(f"lr={lr} must be >= 0")
        for name, beta in zip(("adam_beta1", "adam_beta2"), betas, strict=True):
            if not 0 <= beta < 1:
                raise ValueError(f"{name}={beta} must be in [0, 1)")
        if not eps > 0:
            raise ValueError(f"eps={eps} (adam_eps) must be > 0")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay={weight_decay} must be >= 0")
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "adapt": adapt,
            "step": 0,
        }
        super().__init__(params, defaults)

    @classmethod
    def from_config(cls, groups: list[dict[str, Any]], cfg: Config) -> _Adam:
        return cls(
            groups,
            lr=cfg.base_lr,  # overwritten before every step by set_lr
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )

    def _moments(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        for p in params:
            state = self.state[p]
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return [self.state[p]["exp_avg"] for p in params], [
            self.state[p]["exp_avg_sq"] for p in params
        ]

    def _group_step(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]):
        group["step"] += 1
        (beta1, beta2), t = group["betas"], group["step"]
        lr, wd = group["lr"], group["weight_decay"]
        m, v = self._moments(params)
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, grads, alpha=1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
        # r = m̂ / (√v̂ + ε), with m̂ = m / (1 − β1^t) and √v̂ = √v / √(1 − β2^t)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(1 - beta2**t))
        torch._foreach_add_(denom, group["eps"])
        u = torch._foreach_div(m, denom)
        torch._foreach_div_(u, 1 - beta1**t)
        if wd != 0:
            torch._foreach_add_(u, params, alpha=wd)  # u = r + λ·w
        if group["adapt"]:
            scale = lr * lamb_trust_ratio(_norms(params), _norms(u))  # η·‖w‖/‖u‖
            torch._foreach_mul_(u, list(scale.unbind()))
            torch._foreach_sub_(params, u)
        else:
            torch._foreach_add_(params, u, alpha=-lr)


class LAMB(_Adam):
    """Layer-wise Adaptive Moments for Batch training, You et al. 2019 Algorithm 2.

    w ← w − η·(‖w‖/‖r + λ·w‖)·(r + λ·w) per parameter tensor, r Adam's bias-corrected step. A group
    with ``adapt=False`` takes the ratio as 1 (with weight_decay=0 that is plain Adam: the bias/BN
    group of ``decay_bn_bias=false``). Differences from ``timm.optim.Lamb`` (the test's
    reference): timm clips the global gradient norm at 1 by default (``max_grad_norm``; Algorithm
    2 does not), and adapts a group only where its weight decay is not 0 (here: where the parameter
    groups say, so LAMB with weight_decay=0 still adapts the decayed group).
    """


class AdamW(_Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019): w ← w − η·(r + λ·w), the decay
    scaled by the lr as in ``torch.optim.AdamW`` (which computes w·(1 − ηλ) − η·r: the same
    iterates up to rounding). No group adapts."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, adapt=False)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        # the groups of param_groups() say adapt=True for the decayed one; AdamW never adapts
        super().add_param_group({**param_group, "adapt": False})


# the classes the optimizers' table names (OptimizerInfo.cls)
CLASSES: dict[str, type[_PerGroup]] = {c.__name__: c for c in (SGD, LARS, LAMB, AdamW)}


def _velocity_keys(cfg: Config) -> dict[str, Any]:
    """The keys of SGD and LARS: the lr inside a velocity."""
    return {
        "lr": cfg.base_lr,  # overwritten before every step by set_lr
        "momentum": cfg.momentum,
        "weight_decay": cfg.weight_decay,
        "nesterov": cfg.nesterov,
        "momentum_correction": cfg.momentum_correction,
    }


def _bn_bias_name(weight_decay: float, adapt: bool) -> str:
    """The name of the biases' and BN's group: "no_decay" as before adapt_bn_bias existed."""
    if weight_decay == 0.0 and not adapt:
        return "no_decay"
    return (
        ("decay" if weight_decay else "no_decay")
        + ("_adapt" if adapt else "_no_adapt")
        + "_bn_bias"
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the lr of every group (call before ``step()``; the correction reads the previous one)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def param_groups(model: nn.Module, cfg: Config) -> list[dict[str, Any]]:
    """The decay(+adapt) and no-decay groups of Jia et al. 2018; empty groups are dropped.

    With ``decay_bn_bias=false`` a parameter goes to the no-decay group when a normalisation module
    (:data:`NORM_TYPES`) owns it or it has ndim <= 1 (biases and any other per-channel vector).
    ``adapt_bn_bias`` (null: as ``decay_bn_bias``) says whether those biases and BN parameters
    take part in LARS's and LAMB's trust ratio, so that the decay alone can change (Jia et al.'s
    slide) without moving them to the raw global lr.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    adapt = cfg.decay_bn_bias if cfg.adapt_bn_bias is None else cfg.adapt_bn_bias
    if cfg.decay_bn_bias and adapt:
        groups = [
            {"params": params, "weight_decay": cfg.weight_decay, "adapt": True, "name": "all"}
        ]
    else:
        decay, bn_bias = _split_bn_bias(model, params)
        wd = cfg.weight_decay if cfg.decay_bn_bias else 0.0
        groups = [
            {"params": decay, "weight_decay": cfg.weight_decay, "adapt": True, "name": "decay"},
            {
                "params": bn_bias,
                "weight_decay": wd,
                "adapt": adapt,
                "name": _bn_bias_name(wd, adapt),
            },
        ]
    return [g for g in groups if g["params"]]


def _split_bn_bias(model: nn.Module, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """``params`` as (the rest, those of a normalisation module or with ndim <= 1), in order."""
    norm_ids = {
        id(p)
        for module in model.modules()
        if isinstance(module, NORM_TYPES)
        for p in module.parameters(recurse=False)
    }
    bn_bias = [p for p in params if id(p) in norm_ids or p.ndim <= 1]
    bn_ids = {id(p) for p in bn_bias}
    return [p for p in params if id(p) not in bn_ids], bn_bias


def build(cfg: Config, model: nn.Module) -> torch.optim.Optimizer:
    """The class of ``cfg.optimizer``'s row in the optimizers' table (:mod:`lbsgd.config.optimizers`:
    sgd → :class:`SGD`, lars → :class:`LARS`, lamb → :class:`LAMB`, adamw → :class:`AdamW`) over
    :func:`param_groups`, made from the keys it reads (its ``from_config``)."""
    return CLASSES[optimizers.info(cfg.optimizer).cls].from_config(param_groups(model, cfg), cfg)


_LARS_LABELS = {  # (weight decay, adaptation) -> label
    (True, True): "decay+adapt",
    (False, False): "no decay/adapt",
    (True, False): "decay, no adapt",
    (False, True): "adapt, no decay",
}


def describe_groups(optimizer: torch.optim.Optimizer) -> str:
    """One line: ``parameter groups: decay+adapt 9 tensors / 77,760 params; no decay/adapt …``."""
    lars = any(
        row.adapts_per_layer and isinstance(optimizer, CLASSES[row.cls]) for row in optimizers.TABLE
    )
    parts = []
    for g in optimizer.param_groups:
        decay = g["weight_decay"] != 0
        if lars:
            label = _LARS_LABELS[decay, g["adapt"]]
        else:
            label = "decay" if decay else "no decay"
        if g.get("name") == "no_decay":
            label += " (bias, norm)"
        n = sum(p.numel() for p in g["params"])
        parts.append(f"{label} {len(g['params'])} tensors / {n:,} params")
    return "parameter groups: " + "; ".join(parts)
