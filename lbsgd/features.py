"""Step features: the optional techniques a synchronous step carries besides the network, behind
one protocol (:class:`StepFeature`), and the step's pending record with the flush's packing.

A feature is its row of :data:`lbsgd.config.step_features.TABLE` (its name, its place in the order
of the hooks) and the class the row names, made from the run's :class:`Parts`; it is called at the
hook points of the step (each method of :class:`StepFeature` says when). Its checkpointed state is
saved and restored by the run in one loop over the features: entries named by ``checkpoint_keys``
at the checkpoint's top level, those named by ``rank_keys`` in each rank's own part.
docs/ARCHITECTURE.md says how a new one is added."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from lbsgd import comm, distributed, noise_scale
from lbsgd.config import Config, Derived, step_features
from lbsgd.staleness import StaleWeights


@dataclass
class Parts:
    """What a feature is made from: the run's keys, derived values, parameters and processes;
    once DDP wraps the network (the table's ``after_wrap`` stage) also the optimizer, the wrapped
    model, its comm hook's state, the step the run starts from and a backward that leaves no
    trace (PowerSGD's bucket rebuild)."""

    cfg: Config
    d: Derived
    params: list[torch.Tensor]
    ctx: distributed.Context
    opt: torch.optim.Optimizer | None = None
    model: torch.nn.Module | None = None
    comm_state: Any = None
    start_step: int = 0
    rebuild: Callable[[], None] | None = None


class StepFeature:
    """An optional step-level technique: every hook a no-op, no checkpointed state."""

    checkpoint_keys: tuple[str, ...] = ()  # its entries at the checkpoint's top level
    rank_keys: tuple[str, ...] = ()  # its entries in each rank's part of the checkpoint
    # values per step it hands to the flush's all-reduce (after_accumulate or before_optimizer_step)
    flush_width = 0

    @property
    def name(self) -> str:
        """The name of the row of lbsgd.config.step_features's table that names its class (its
        class's name without one)."""
        cls = type(self).__name__
        return next((row.name for row in step_features.TABLE if row.cls == cls), cls)

    def state_dict(self) -> dict[str, Any]:
        """Its checkpointed state: one value per key of ``checkpoint_keys`` and ``rank_keys``."""
        return {}

    def load_state_dict(self, saved: dict[str, Any], where: str) -> None:
        """On resume: the checkpoint ``where``'s value of each of its keys (None when absent)."""

    def announce(self) -> None:
        """Rank 0's lines about it once it is attached and restored."""

    def bucket_reader(self) -> Any | None:
        """What DDP's comm hook hands each process's gradient bucket to before the bucket's
        all-reduce (:func:`lbsgd.comm.register`'s ``noise``), or None. Asked before DDP wraps
        the network, of the features registered then."""
        return None

    def before_step(self, step: int) -> None:
        """Optimizer step ``step`` (0-based) starts."""

    def before_micro_batch(self, i: int) -> None:
        """Before micro-batch ``i`` of this rank's step is read and run (its seeds are set)."""

    def after_backward(self, i: int, synced: bool) -> None:
        """After micro-batch ``i``'s backward (``synced``: DDP all-reduced it)."""

    def after_accumulate(self, loss_scale: torch.Tensor) -> torch.Tensor | None:
        """The step's gradients are accumulated (not unscaled yet); ``flush_width`` values per
        step for the flush's all-reduce (its mean over the processes), or None."""
        return None

    def before_optimizer_step(self) -> torch.Tensor | None:
        """The step's gradients are unscaled in ``.grad`` (all-reduced; under fp16 inf/NaN when
        the step overflowed, and then skipped); the optimizer steps next. ``flush_width``
        values per step for the flush's all-reduce, or None (then after_accumulate's)."""
        return None

    def after_optimizer_step(self) -> None:
        """The optimizer stepped (gradients still in ``.grad``)."""

    def local_step(self, step: int) -> bool:
        """Whether step ``step``'s gradients stay on this process (no all-reduce)."""
        return False

    def models_agree(self, step: int) -> bool:
        """Whether every process holds the same model after step ``step`` (0-based)."""
        return True

    def at_boundary(self) -> None:
        """An epoch's end or the last step, before its evaluation and checkpoint."""

    def flush_record(self, values: list[float]) -> dict[str, Any]:
        """Its fields of one flushed step's train record, from its averaged ``values``."""
        return {}

    def after_flush(self, summary: dict[str, Any]) -> None:
        """After a flush's records: its part of summary.json."""


class NoiseProbe(StepFeature):
    """``noise_scale=true``: the gradient noise scale's probe (lbsgd.noise_scale); its smoothed
    estimate is checkpointed, each step's |G_small|² and |G_big|² travel with the flush."""

    checkpoint_keys = ("noise_scale",)
    flush_width = 2

    def __init__(self, p: Parts):
        self.probe = noise_scale.Probe(
            p.params,
            micro_per_group=p.d.noise_micro_batches,
            accum_steps=p.d.accum_steps,
            b_small=p.d.noise_batch,
            b_big=p.cfg.batch_size,
            decay=p.cfg.noise_scale_ema,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"noise_scale": self.probe.smoother.state_dict()}

    def load_state_dict(self, saved: dict[str, Any], where: str) -> None:
        if saved["noise_scale"] is not None:
            self.probe.smoother.load_state_dict(saved["noise_scale"])

    def bucket_reader(self) -> noise_scale.Probe:
        return self.probe

    def before_step(self, step: int) -> None:
        self.probe.start()

    def after_backward(self, i: int, synced: bool) -> None:
        self.probe.after_backward(i, synced=synced)

    def after_accumulate(self, loss_scale: torch.Tensor) -> torch.Tensor:
        return self.probe.finish(loss_scale)

    def flush_record(self, values: list[float]) -> dict[str, Any]:
        return self.probe.record(*values)

    def after_flush(self, summary: dict[str, Any]) -> None:
        g_sq, trace, b_simple = self.probe.smoother.value()
        summary["noise_scale"] = {
            "b_simple": b_simple,
            "g_sq": g_sq,
            "trace": trace,
            "b_small": self.probe.b_small,
            "b_big": self.probe.b_big,
        }


class Staleness(StepFeature):
    """``staleness`` > 0: each micro-batch's forward/backward runs on past weights W_{t-tau}, the
    optimizer steps W_t (lbsgd.staleness); the ring of past weights is checkpointed (the same on
    every rank)."""

    checkpoint_keys = ("staleness",)

    def __init__(self, p: Parts):
        self.ring = StaleWeights(p.params, p.cfg.staleness, p.cfg.staleness_dist, p.cfg.seed)
        self.first = p.ctx.rank * p.d.accum_steps  # this rank's first micro-batch in the step

    def state_dict(self) -> dict[str, Any]:
        return {"staleness": self.ring.state_dict()}

    def load_state_dict(self, saved: dict[str, Any], where: str) -> None:
        self.ring.load_state_dict(saved["staleness"], where)

    def before_step(self, step: int) -> None:
        self.ring.begin(step)  # W_t enters the ring

    def before_micro_batch(self, i: int) -> None:
        self.ring.use(self.first + i)  # W_{t-tau} for the global micro-batch's forward/backward

    def after_accumulate(self, loss_scale: torch.Tensor) -> None:
        self.ring.restore()  # the optimizer steps W_t with the stale gradient


class GradClip(StepFeature):
    """``grad_clip``: the step's gradient rescaled to a global L2 norm of at most ``max_norm``
    before the optimizer steps (``torch.nn.utils.clip_grad_norm_`` after unscaling, as PyTorch's
    AMP recipe, timm's ``--clip-grad`` and nanoGPT's ``grad_clip`` do). The gradient is the
    all-reduced one, the same on every process, so every process clips by the same factor; the
    loss gradient alone (the optimizers add weight decay inside their step). Its norm before
    clipping travels with the flush as the step's ``grad_norm`` (inf or nan on an fp16 step that
    overflowed: that step is skipped, so its clipped gradient is never used, as in the plain
    recipe, where GradScaler.step skips the optimizer's step)."""

    flush_width = 1

    def __init__(self, p: Parts):
        self.max_norm, self.params = p.cfg.grad_clip, p.params

    def before_optimizer_step(self) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        return norm.detach().double().reshape(1)

    def flush_record(self, values: list[float]) -> dict[str, Any]:
        return {"grad_norm": values[0]}


class PowerSGDState(StepFeature):
    """``comm_hook=powersgd``: the hook's error feedback and low-rank factors, each process's own,
    checkpointed per rank; on resume on another layout (or without them), fresh error feedback."""

    rank_keys = ("powersgd",)

    def __init__(self, p: Parts):
        self.state, self.model, self.start_step = p.comm_state, p.model, p.start_step
        self.rebuild, self.is_main = p.rebuild, p.ctx.is_main  # a backward that leaves no trace

    def state_dict(self) -> dict[str, Any]:
        return {"powersgd": self.state.memories()}

    def load_state_dict(self, saved: dict[str, Any], where: str) -> None:
        if saved["powersgd"] is not None:  # this process's memories, exactly
            comm.rebuild_buckets(self.model, self.state, self.rebuild)
            self.state.load_memories(saved["powersgd"])
            return
        # another number of processes, or no PowerSGD then: fresh error feedback
        self.state.iter = self.start_step  # (compression stays on past the warmup)
        if self.is_main:
            print(
                "lbsgd: comm_hook=powersgd resumes with fresh error feedback (the "
                "checkpoint holds no PowerSGD state for this process)",
                flush=True,
            )


class LocalSGD(StepFeature):
    """``local_sgd`` > 0: post-local SGD after the warmup (lbsgd.comm.LocalSGD), or BMUF when its
    block momentum / block lr are off their defaults (lbsgd.comm.BMUF; on one process too). Each
    process's momentum is checkpointed per rank; BMUF's W and Delta at the top level."""

    rank_keys = ("optimizer",)

    def __init__(self, p: Parts):
        cfg, d, params, start_step = p.cfg, p.d, p.params, p.start_step
        self.cfg, self.d, self.params, self.opt, self.start_step = cfg, d, params, p.opt, start_step
        self.world_size, self.is_main = p.ctx.world_size, p.ctx.is_main
        self.bmuf = step_features.bmuf_filters(cfg)
        if self.bmuf:
            self.checkpoint_keys = ("bmuf",)
            self.averager = comm.BMUF(
                period=cfg.local_sgd,
                start=d.switch_step,
                step=start_step,
                params=params,
                block_momentum=cfg.block_momentum,
                block_lr=cfg.block_lr,
                nesterov=cfg.block_nesterov,
            )
        else:
            self.averager = comm.LocalSGD(cfg.local_sgd, start=d.switch_step, step=start_step)

    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.opt.state_dict()}  # this process's own momentum
        if self.bmuf:  # W and Delta, the same on every rank
            state["bmuf"] = self.averager.state_dict()
        return state

    def load_state_dict(self, saved: dict[str, Any], where: str) -> None:
        if saved["optimizer"] is not None:
            self.opt.load_state_dict(saved["optimizer"])
        if not self.bmuf:
            return
        if saved["bmuf"] is not None:
            self.averager.load_state_dict(saved["bmuf"])
        elif self.start_step > self.d.switch_step and self.is_main:
            print(
                "lbsgd: BMUF resumes with Delta = 0 from the checkpoint's model (the "
                "checkpoint holds no BMUF state)",
                flush=True,
            )

    def announce(self) -> None:
        if not (self.bmuf and self.is_main):
            return
        cfg = self.cfg
        start = "W + eta_B Delta (Nesterov)" if cfg.block_nesterov else "W (classical)"
        print(
            f"lbsgd: BMUF eta_B={cfg.block_momentum:g} eps_B={cfg.block_lr:g}: blocks of "
            f"{cfg.local_sgd} local steps on {self.world_size} processes after step "
            f"{self.d.switch_step}, each from {start}",
            flush=True,
        )

    def local_step(self, step: int) -> bool:
        return self.averager.local(step)

    def models_agree(self, step: int) -> bool:
        return self.averager.in_sync(step)

    def after_optimizer_step(self) -> None:
        # before zero_grad: torch's averager skips parameters without a gradient
        self.averager.after_step(self.params)

    def at_boundary(self) -> None:
        self.averager.sync(self.params)


# -- the table: built, ordered, checkpointed, flushed ---------------------------------------------

# The classes the step features' table names (StepFeatureRow.cls): this module's StepFeatures
CLASSES: dict[str, type[StepFeature]] = {c.__name__: c for c in StepFeature.__subclasses__()}


def in_order(table: list[StepFeature]) -> list[StepFeature]:
    """``table`` in the order of lbsgd.config.step_features's table (a feature without a row there
    is a programming error)."""
    order = [row.name for row in step_features.TABLE]
    missing = [f.name for f in table if f.name not in order]
    if missing:
        raise ValueError(f"step features without a row in config.step_features.TABLE: {missing}")
    return sorted(table, key=lambda f: order.index(f.name))


def made(stage: str, parts: Parts) -> list[StepFeature]:
    """The features ``parts``'s run carries that are made at ``stage`` (``before_wrap``: before
    DDP wraps the network, whose comm hook may read a feature's bucket reader; ``after_wrap``),
    each by the class its row of lbsgd.config.step_features's table names."""
    return [
        CLASSES[row.cls](parts)
        for row in step_features.TABLE
        if row.stage == stage and row.carried_by(parts.cfg, parts.d)
    ]


def checkpoint_entries(table: list[StepFeature]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The features' checkpointed state: (this rank's part, the checkpoint's top level)."""
    mine: dict[str, Any] = {}
    shared: dict[str, Any] = {}
    for f in table:
        state = f.state_dict()
        mine.update({k: state[k] for k in f.rank_keys})
        shared.update({k: state[k] for k in f.checkpoint_keys})
    return mine, shared


def restore(table: list[StepFeature], state: dict[str, Any], mine: dict[str, Any], where: str):
    """Each feature's entries of the checkpoint ``state`` (``mine``: this rank's part, for its
    ``rank_keys``), None where absent; ``where`` names the checkpoint in a refusal."""
    for f in table:
        saved = {k: state.get(k) for k in f.checkpoint_keys}
        saved.update({k: mine.get(k) for k in f.rank_keys})
        f.load_state_dict(saved, where)


def step_values(
    table: list[StepFeature], early: list[Any], late: list[Any]
) -> list[torch.Tensor | None]:
    """Each feature's values for the flush of this step: from ``after_accumulate`` (``early``) or
    from ``before_optimizer_step`` (``late``), never both (a feature that returns from both is a
    programming error, refused naming it)."""
    both = [
        f.name
        for f, a, b in zip(table, early, late, strict=True)
        if a is not None and b is not None
    ]
    if both:
        raise RuntimeError(
            f"step features {both} return flush values from both after_accumulate and "
            "before_optimizer_step: one hook carries them"
        )
    return [a if b is None else b for a, b in zip(early, late, strict=True)]


def flush_records(
    table: list[StepFeature], extra: list[float], k: int, summary: dict[str, Any]
) -> list[dict[str, Any]]:
    """The features' part of each of the ``k`` flushed steps' records, from their averaged values
    (``flush_width`` each, step by step); then their parts of ``summary``."""
    records: list[dict[str, Any]] = [{} for _ in range(k)]
    width, offset = sum(f.flush_width for f in table), 0
    for f in table:
        for j, rec in enumerate(records):
            start = j * width + offset
            if f.flush_width:
                rec.update(f.flush_record(extra[start : start + f.flush_width]))
        offset += f.flush_width
        f.after_flush(summary)
    return records


# -- the step's pending record and the flush's packing --------------------------------------------


class Pending(NamedTuple):
    """One optimizer step awaiting a flush (no host read yet)."""

    step: int  # steps done: this step's 1-based number
    lr: float
    loss: torch.Tensor  # the step's mean loss over this rank's micro-batches
    loss_scale: torch.Tensor | float  # the loss scaler's scale after the step
    extra: list[torch.Tensor]  # the features' values for the flush, in the features' order


class Reduced(NamedTuple):
    """A flush's all-reduced values, unpacked (:func:`unpack_flush`)."""

    losses: list[float]  # each pending step's loss, averaged over the processes
    scales: list[float]  # each step's loss scale
    stop_asked: bool  # some process was asked to stop
    extra: list[float]  # the features' values, step by step (flush_width each)


def pack_flush(pending: list[Pending], asked: torch.Tensor) -> torch.Tensor:
    """One tensor for the flush's all-reduce: the ``k`` pending losses, their ``k`` loss scales,
    ``asked`` (1.0 if this process was asked to stop), then the features' values step by step (in
    float64 when there are any)."""
    device = pending[0].loss.device
    scales = [torch.as_tensor(p.loss_scale, dtype=torch.float32, device=device) for p in pending]
    values = torch.stack([*(p.loss for p in pending), *scales, asked])
    extra = [t for p in pending for t in p.extra]
    if extra:  # e.g. each process's mean |G_small|^2 and |G_big|^2 (the noise probe)
        values = torch.cat([values.double(), *extra])
    return values


def unpack_flush(reduced: list[float], k: int) -> Reduced:
    """:func:`pack_flush`'s values of ``k`` steps, averaged and read back as floats."""
    return Reduced(reduced[:k], reduced[k : 2 * k], reduced[2 * k] > 0, reduced[2 * k + 1 :])
