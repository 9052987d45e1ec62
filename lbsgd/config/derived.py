"""The derived values: everything computed from the keys, the number of processes and the size of
the train split (:class:`Derived`, :func:`derive`), here and nowhere else. They are printed at the
start of every run and written to its config.yaml (:func:`lbsgd.config.load.dump`).

Some are a value or one line saying why there is none (the micro-batch of ``micro_batch=auto``,
the noise scale's small batch); :func:`derive` checks the layout first
(:func:`check_world`, here beside the values it checks).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lbsgd.config.schema import Keys, plain
from lbsgd.registry import ConfigError

# Metadata of a Derived field that a run's config.yaml does not record
UNRECORDED = "unrecorded"


def _unrecorded() -> Any:
    return dataclasses.field(kw_only=True, metadata={UNRECORDED: True})


@dataclasses.dataclass(frozen=True)
class Derived:
    """Everything computed from the keys, the world size and the train-split size. One place."""

    world_size: int
    micro_batch: int  # samples per process per forward/backward
    accum_steps: int  # micro-batches per process per optimizer step
    num_train: int  # N: samples in the train split
    steps_per_epoch: float  # N / kn (fractional: epochs are counted in samples, see data.sampler)
    total_steps: int  # ceil(epochs * N / kn)
    lr: float  # peak learning rate eta-hat = base_lr * f(kn / reference_batch)
    warmup_start_lr: float  # first lr of the warmup
    warmup_steps: int  # round(warmup_epochs * N / kn)
    milestone_steps: tuple[int, ...]  # round(milestone * N / kn), schedule=step
    noise_batch: int | None = None  # B_small of noise_scale=true (lbsgd.noise_scale); None: off
    # Not written to config.yaml (added after runs were committed; each follows from the keys and
    # the values above, so that a run's config.yaml stays what it was)
    bn_groups: int = _unrecorded()  # ghost-BN groups per optimizer step: batch_size / bn_batch
    noise_micro_batches: int | None = _unrecorded()  # noise_batch / micro_batch; None: off
    switch_step: int = _unrecorded()  # PowerSGD and local SGD/BMUF start: the key, or warmup_steps

    def to_dict(self) -> dict[str, Any]:
        """The values a run's config.yaml records (:data:`DERIVED_KEYS`), in their order."""
        return plain({k: v for k, v in dataclasses.asdict(self).items() if k in DERIVED_KEYS})


# The derived values written to a run's config.yaml (and dropped when one is read as keys)
DERIVED_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Derived) if not f.metadata.get(UNRECORDED)
)
# What a run's config.yaml may record beside its keys and derived values: a sweep's copy of a run
# trained by another study names it (``copied_from: <study>/<run>``; lbsgd.lab.experiments.sweep)
RECORD_KEYS: tuple[str, ...] = ("copied_from",)


def epoch_steps(epochs: float, steps_per_epoch: float) -> int:
    """A length in epochs as whole steps, to the nearest (half up): a run's warmup and milestones
    (one rule)."""
    # round half up: no banker's rounding of iteration counts
    return int(math.floor(epochs * steps_per_epoch + 0.5))


def micro_batch(c: Keys, world_size: int = 1) -> int:
    """The micro-batch of a fixed ``micro_batch`` key; for ``auto``, the largest candidate (the
    run's probe, ``pick_micro_batch``, picks among :func:`micro_batch_candidates` on a device), or
    one line saying why there is none."""
    if c.micro_batch != "auto":
        return c.micro_batch if c.micro_batch is not None else c.bn_batch
    if largest := _largest_auto(c, world_size):
        return largest
    world_size = 1 if c.async_ps else world_size
    raise ConfigError(
        f"micro_batch=auto: batch_size={c.batch_size} is not a multiple of world_size * "
        f"bn_batch = {world_size} * {c.bn_batch} = {world_size * c.bn_batch}"
    )


def _largest_auto(c: Keys, world_size: int) -> int:
    """The largest multiple of bn_batch dividing the per-process share (and the noise scale's
    small batch): their gcd when bn_batch divides it; 0 when there is none."""
    if c.async_ps:  # one update = one worker's whole batch (lbsgd.parameter_server)
        world_size = 1
    if c.batch_size % world_size:
        return 0
    share = c.batch_size // world_size
    # noise_scale with a fixed small batch: micro-batches make it up whole
    group = c.noise_scale_batch if c.noise_scale and c.noise_scale_batch else share
    largest = math.gcd(share, group)
    return largest if largest % c.bn_batch == 0 else 0


def micro_batch_candidates(c: Keys, world_size: int) -> list[int]:
    """Multiples of bn_batch that divide the per-process share batch_size / world_size, largest
    first (empty when the share is not a multiple of bn_batch): bn_batch times each divisor of
    the largest over bn_batch."""
    n = _largest_auto(c, world_size) // c.bn_batch
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return [c.bn_batch * d for d in sorted({*small, *(n // d for d in small)}, reverse=True)]


def accum_steps(c: Keys, world_size: int, micro: int | None = None) -> int:
    """Micro-batches per process per optimizer step on ``world_size`` processes with micro-batch
    ``micro`` (the key's by default; for ``auto``, the largest candidate): batch_size /
    (world_size * micro_batch), one worker's batch under ``async_ps``. A layout it does not
    divide is refused by :func:`check_world`."""
    if c.async_ps:  # one update = one worker's whole batch (lbsgd.parameter_server)
        world_size = 1
    m = micro if micro is not None else micro_batch(c, world_size)
    return c.batch_size // (world_size * m)


def noise_batch(c: Keys, world_size: int, micro: int) -> int | None:
    """B_small of ``noise_scale`` (None when it is off), or one line saying why the layout
    cannot measure it: the small batch is whole micro-batches of one process, and smaller than
    the global batch."""
    if not c.noise_scale:
        return None
    b_small = c.noise_scale_batch or micro
    key = (
        f"noise_scale_batch={c.noise_scale_batch}"
        if c.noise_scale_batch
        else f"noise_scale_batch=null (= micro_batch={micro})"
    )
    share = c.batch_size // world_size
    if b_small % micro or share % b_small:
        raise ConfigError(
            f"{key} must be a multiple of micro_batch={micro} dividing the per-process share "
            f"batch_size / world_size = {c.batch_size} / {world_size} = {share}"
        )
    if b_small >= c.batch_size:
        raise ConfigError(
            f"noise_scale=true compares two batch sizes: {key} must be smaller than "
            f"batch_size={c.batch_size} (valid: a multiple of micro_batch={micro} dividing "
            f"{share}, below {c.batch_size})"
        )
    return b_small


def derive(c: Keys, world_size: int, num_train: int, micro: int | None = None) -> Derived:
    """``micro``: the micro-batch chosen for ``micro_batch=auto`` (the largest candidate if None)."""
    if micro is None:
        micro = micro_batch(c, world_size)
    check_world(c, world_size, micro=micro)
    scale = lr_scale(c.lr_scaling, c.batch_size / c.reference_batch)
    spe = num_train / c.batch_size
    warmup_steps = 0 if c.warmup == "none" else epoch_steps(c.warmup_epochs, spe)
    b_small = noise_batch(c, world_size, micro)
    return Derived(
        world_size=world_size,
        micro_batch=micro,
        accum_steps=accum_steps(c, world_size, micro),
        num_train=num_train,
        steps_per_epoch=spe,
        total_steps=max(1, math.ceil(c.epochs * spe - 1e-9)),
        lr=c.base_lr * scale,
        warmup_start_lr=c.warmup_lr if c.warmup_lr is not None else c.base_lr,
        warmup_steps=warmup_steps,
        milestone_steps=tuple(epoch_steps(m, spe) for m in c.milestones),
        noise_batch=b_small,
        bn_groups=c.batch_size // c.bn_batch,
        noise_micro_batches=b_small // micro if b_small else None,
        switch_step=warmup_steps if c.switch_step is None else c.switch_step,
    )


def warmup_warning(c: Keys, d: Derived) -> str | None:
    """The line printed before training when the warmup outlasts the run (short test runs are
    common, so it trains): its lr never reaches the peak ``d.lr``; None otherwise."""
    if d.warmup_steps <= d.total_steps:
        return None
    return (
        f"lbsgd: warning: warmup_epochs={c.warmup_epochs:g} is longer than the run "
        f"(epochs={c.epochs:g}: {d.warmup_steps} warmup steps of {d.total_steps}): the lr never "
        f"reaches its peak {d.lr:.6g}"
    )


def lr_scale(lr_scaling: str, ratio: float) -> float:
    """f(kn / reference_batch) of the learning-rate rule ``lr_scaling`` at ``ratio``."""
    if lr_scaling == "sqrt":
        return math.sqrt(ratio)
    return ratio if lr_scaling == "linear" else 1.0


def check_world(
    c: Keys, world_size: int, local_world_size: int | None = None, micro: int | None = None
) -> None:
    """One line saying why ``world_size`` processes (``local_world_size`` per node) cannot run
    ``c`` with micro-batch ``micro`` (the key's by default; for ``auto``, the largest candidate),
    else nothing. The accumulation steps they run: :func:`lbsgd.config.derived.accum_steps`."""
    if c.async_ps:  # one update = one worker's whole batch (lbsgd.parameter_server)
        world_size = 1
    if c.comm_hook == "hierarchical" and local_world_size and world_size % local_world_size:
        raise ConfigError(
            f"comm_hook=hierarchical needs the same number of processes on every node: "
            f"world_size={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}"
        )
    m = micro if micro is not None else micro_batch(c, world_size)
    per_step = world_size * m
    if c.batch_size % per_step:
        raise ConfigError(
            f"batch_size={c.batch_size} is not a multiple of world_size * micro_batch = "
            f"{world_size} * {m} = {per_step}"
        )
    if c.noise_scale:
        noise_batch(c, world_size, m)
