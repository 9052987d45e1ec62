"""The arithmetic of a plan: steps to a target against the batch size, the learning rate a batch
gets, the time of a step on p GPUs, and the choice of batch and GPU count. Pure functions of
measured numbers (:mod:`lbsgd.plan.measure` and :mod:`lbsgd.plan.timer` measure them); no torch.

Steps follow McCandlish et al. 2018 (eq. 2.11): S(B) = S_min (1 + B_crit/B) with B_crit read as
the noise scale at the target, so one run at B_ref reaching the target in S_ref steps fixes
S_min = S_ref / (1 + B_crit/B_ref). A step on p workers is a worker's compute plus a ring
all-reduce overlapped with the last micro-batch's backward: t = t_c + max(0, T − f·t_last). The
formulas, and AdaScale's and Pollux's equal statements of the efficiency: docs/planning.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lbsgd import costmodel
from lbsgd.config import Config, derive, lr_scale

# the learning-rate rules a plan gives its rows, each with its source (``lbsgd plan --lr-rule``)
RULES: dict[str, str] = {
    "saturating": "McCandlish et al. 2018, eq. 2.6-2.8: eps(B) = eps_max / (1 + B_noise/B), "
    "linear far below B_noise and level far above it; eps_max through the probe's lr at its batch",
    "linear": "Goyal et al. 2017, §2.1: the linear scaling rule (the saturating rule's limit far "
    "below B_noise)",
    "sqrt": "square-root scaling: You et al. 2020 (LAMB), §4; Malladi et al. 2022 "
    "(arXiv:2205.10287) for Adam",
}
# each optimizer's rule by default: the linear rule ran 26-34% slow at 4x the probe's batch and
# diverged at 16x on a network the plan was not tuned to, below B_crit; the Adam family keeps its
# square root (tune the lr above B_noise: the warning)
DEFAULT_RULE = {"sgd": "saturating", "lars": "saturating", "lamb": "sqrt", "adamw": "sqrt"}
ADAM_FAMILY = ("lamb", "adamw")
E_FACTOR = 2.0  # the recommendation: compute within this factor of E_min (B ≤ B_crit at 2)


# -- steps ---------------------------------------------------------------------------------------


def s_min_from(steps_ref: float, batch_ref: float, b_crit: float) -> float:
    """S_min from one run at ``batch_ref`` that reached the target in ``steps_ref`` steps."""
    return steps_ref / (1 + b_crit / batch_ref)


def steps_to_target(batch: float, s_min: float, b_crit: float) -> float:
    """S(B) = S_min (1 + B_crit/B)."""
    return s_min * (1 + b_crit / batch)


# -- learning rate -------------------------------------------------------------------------------


def lr_rule(optimizer: str, rule: str | None = None) -> tuple[str, str]:
    """(rule, source): ``rule`` if named, else ``optimizer``'s default (:data:`DEFAULT_RULE`)."""
    name = rule or DEFAULT_RULE[optimizer]
    return name, RULES[name]


@dataclass(frozen=True)
class Lr:
    """A rule's inputs: the config's ``base_lr`` at ``reference_batch`` (linear and square root:
    what a run with ``lr_scaling`` derives, :func:`lbsgd.config.lr_scale`), and the probe's peak
    lr ``anchor_lr`` at its batch ``anchor_batch`` with the noise scale ``b_noise`` (saturating:
    McCandlish's curve through the probe's point, so ε_max = lr_probe (1 + B_noise/B_probe)); and
    the lr range test's ``bound`` at ``bound_batch`` (:mod:`lbsgd.plan.lr_range`; None: no bound
    found or none run), carried to every batch along the saturating curve through it, which caps
    every rule."""

    rule: str
    base_lr: float
    reference_batch: int
    anchor_lr: float
    anchor_batch: int
    b_noise: float
    bound: float | None = None
    bound_batch: int = 0  # the batch the range test ran at (0: none ran)
    tested_to: float = 0.0  # the lr its ramp reached

    @property
    def eps_max(self) -> float:
        """The saturating curve's level: the probe's, or the range test's where lower."""
        return min(self.anchor_lr * (1 + self.b_noise / self.anchor_batch), self.cap(math.inf))

    def cap(self, batch: float) -> float:
        """The range test's bound at ``batch`` (inf: none)."""
        if self.bound is None:
            return math.inf
        return self.bound * (1 + self.b_noise / self.bound_batch) / (1 + self.b_noise / batch)

    def saturating(self, batch: float, b_noise: float) -> float:
        """McCandlish's curve through the probe's point at ``batch`` for ``b_noise`` (inf: the
        linear rule, its limit)."""
        if math.isinf(b_noise):
            return self.anchor_lr * batch / self.anchor_batch
        return self.anchor_lr * (1 + b_noise / self.anchor_batch) / (1 + b_noise / batch)

    def by_rule(self, batch: float) -> float:
        """The rule's lr at ``batch`` before the range test's cap."""
        if self.rule == "saturating":
            return self.saturating(batch, self.b_noise)
        return self.base_lr * lr_scale(self.rule, batch / self.reference_batch)

    def at(self, batch: float) -> float:
        return min(self.by_rule(batch), self.cap(batch))

    def capped(self, batch: float) -> bool:
        return self.cap(batch) < self.by_rule(batch)

    def describe(self) -> str:
        probe = self.anchor_lr * (1 + self.b_noise / self.anchor_batch)
        if self.rule != "saturating":
            own = f"base_lr {self.base_lr:g} at batch {self.reference_batch}"
        else:
            own = (
                f"eps_max {self.eps_max:.4g}: the probe's lr {self.anchor_lr:.4g} at batch "
                f"{self.anchor_batch} x (1 + B_noise {self.b_noise:.0f}/{self.anchor_batch}) = "
                f"{probe:.4g}"
            )
        if self.bound is None:
            if not self.bound_batch:
                return own
            return (
                f"{own}; the lr range test at batch {self.bound_batch} found no bound up to lr "
                f"{self.tested_to:.3g}"
            )
        level = self.cap(math.inf)
        bound = (
            f"the lr range test's bound {self.bound:.4g} at batch {self.bound_batch} x (1 + "
            f"B_noise {self.b_noise:.0f}/{self.bound_batch}) = {level:.4g}"
        )
        if self.rule == "saturating" and level >= probe:
            return f"{own}; {bound}, above it (no row capped)"
        return f"{own}; capped by {bound} on the saturating curve"


def lr_warning(optimizer: str, batch: float, b_noise: float) -> str | None:
    """Above B_noise the square-root rule is outside the regime it was derived for (Malladi et
    al. 2022 derive it from an SDE that holds while the gradient noise dominates)."""
    if optimizer in ADAM_FAMILY and batch > b_noise:
        return (
            f"batch {batch:g} > B_noise {b_noise:.0f}: the square-root rule for {optimizer} is "
            "derived where the gradient noise dominates; tune the lr here"
        )
    return None


# -- time ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compute:
    """A worker's compute: ``per_micro_s`` + ``per_sample_s`` × m seconds for a micro-batch of m
    (forward, backward and update), the backward's share ``backward_fraction`` of it, the largest
    micro-batch that fits, ``max_micro``; and, fitted to steps of two processes (where the
    machine has two devices), ``parallel_per_sample_s``, a sample's compute while every worker
    computes at once (the workers of one machine share its memory bandwidth; None: as alone), and
    ``sync_s``, what a step of several workers costs beyond compute and the α–β all-reduce (DDP's
    bookkeeping, waiting for the slowest worker; 0 where not measured). A micro-batch of one BN
    group (``group`` samples) takes ``one_group_s`` where measured: one BN kernel per layer where
    two or more groups loop over theirs (lbsgd.models.ghost_bn), a step the line through the larger
    micro-batches does not hold (docs/planning.md)."""

    per_micro_s: float
    per_sample_s: float
    backward_fraction: float
    max_micro: int
    sync_s: float = 0.0
    parallel_per_sample_s: float | None = None
    one_group_s: float | None = None
    group: int = 0

    def among(self, workers: int) -> Compute:
        """The compute of one of ``workers`` workers: alone, or among others (a sample's share
        of the shared machine added to the one-group step as to the line)."""
        if workers == 1 or self.parallel_per_sample_s is None:
            return self
        # workers sharing a machine only slow each other: a 2-process slope below one process's
        # (fashion-long's plan: 299 against 338 us a sample) is the noise of a fit through two
        # timings, and taken at its word made p workers each faster than one alone (a system
        # efficiency above 1)
        extra = max(0.0, self.parallel_per_sample_s - self.per_sample_s)
        one = None if self.one_group_s is None else self.one_group_s + extra * self.group
        return dataclasses.replace(self, per_sample_s=self.per_sample_s + extra, one_group_s=one)

    def micro_s(self, m: int) -> float:
        if self.one_group_s is not None and m == self.group:
            return self.one_group_s
        return self.per_micro_s + self.per_sample_s * m


def fit_compute(steps: dict[int, float], group: int) -> tuple[float, float, float | None]:
    """(per_micro_s, per_sample_s, one_group_s) from measured steps of one micro-batch
    ``{m: seconds}``: the line through the two largest, and the one-group step apart where the
    two largest are both of two or more groups. A single size, or a line that would start below
    zero (the smaller step timed slow against the larger, as on a loaded machine): all per sample,
    through the largest."""
    sizes = sorted(steps)
    one = steps[group] if group in steps and len(sizes) > 2 else None
    m2, t2 = sizes[-1], steps[sizes[-1]]
    m1 = sizes[-2] if len(sizes) > 1 else m2
    t1 = steps[m1]
    if m1 == m2 or t1 * m2 < t2 * m1:  # one size, or an intercept below zero
        return 0.0, t2 / m2, one
    per_sample = max(0.0, (t2 - t1) / (m2 - m1))
    return t1 - per_sample * m1, per_sample, one


def micro_batch(per_worker: int, max_micro: int, granule: int) -> int | None:
    """The largest multiple of ``granule`` (bn_batch) that divides ``per_worker`` and is at most
    ``max_micro``; None when ``per_worker`` is no multiple of ``granule``."""
    if per_worker < granule or per_worker % granule:
        return None
    n = per_worker // granule
    best = 1
    for d in range(1, n + 1):
        if n % d == 0 and d * granule <= max_micro:
            best = d
    return best * granule


def compute_time(c: Compute, per_worker: int, micro: int) -> tuple[float, float]:
    """(t_c, t_last): a worker's compute for ``per_worker`` samples in micro-batches of
    ``micro``, and the last micro-batch's share."""
    t_micro = c.micro_s(micro)
    return (per_worker // micro) * t_micro, t_micro


def step_time(
    c: Compute, per_worker: int, micro: int, workers: int, grad_bytes: float, link: costmodel.Link
) -> tuple[float, float, float]:
    """(step, compute, all-reduce) seconds of one step at ``workers`` workers of ``per_worker``
    samples: the ring all-reduce overlaps the last micro-batch's backward, and a step of several
    workers costs ``c.sync_s`` more. At one worker the step is the compute."""
    t_c, t_last = compute_time(c.among(workers), per_worker, micro)
    t_comm = costmodel.ring_time(grad_bytes, workers, link)
    hidden = c.backward_fraction * t_last
    sync = c.sync_s if workers > 1 else 0.0
    return t_c + max(0.0, t_comm - hidden) + sync, t_c, t_comm


# -- the table and the choice --------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What a plan is made of: the measured noise scale and S_min, the compute, the link, the
    dataset size, the config its rows are built from (:func:`row_keys`; their lr and warmup
    :func:`lbsgd.config.derive`'s) and the lr's inputs (:func:`lr_of`)."""

    b_crit: float
    s_min: float
    compute: Compute
    link: costmodel.Link
    grad_bytes: float
    train_samples: int
    config: Config
    lr: Lr
    b_crit_range: tuple[float, float] | None = None  # the noise scale's interval at the target
    steps_range: tuple[float, float] | None = None  # the probe's own steps: between evaluations
    timed_gpus: int = 0  # the most processes timed at once (0: as many as planned)
    b_crit_lower: bool = False  # B_simple still growing at the target: B_crit a lower bound


def lr_of(
    cfg: Config,
    b_noise: float,
    rule: str | None = None,
    probe_batch: int = 0,
    probe_lr: float = math.nan,
    bound: tuple[float | None, int, float] = (None, 0, 0.0),
) -> Lr:
    """The lr's inputs, once: ``rule`` (None: the optimizer's, :data:`DEFAULT_RULE`), the config's
    base_lr and reference_batch, the probe's peak lr at its batch (by default the linear rule's at
    reference_batch) and the lr range test's (bound, batch, lr its ramp reached)."""
    batch = probe_batch or cfg.reference_batch
    if not math.isfinite(probe_lr):
        probe_lr = cfg.base_lr * lr_scale("linear", batch / cfg.reference_batch)
    name = lr_rule(cfg.optimizer, rule)[0]
    return Lr(name, cfg.base_lr, cfg.reference_batch, probe_lr, batch, b_noise, *bound)


def lr_keys(cfg: Config, rule: str, lr: float, batch: int) -> dict[str, Any]:
    """The keys that give a run at ``batch`` a row's peak ``lr``: the config's lr_scaling set to
    the rule (linear, sqrt) where that derives the row's lr; else (the saturating rule, or a
    rule's lr capped by the range test) the lr itself (``lr_scaling: none``) with the warmup
    starting where the config's starts."""
    if rule != "saturating" and math.isclose(
        cfg.base_lr * lr_scale(rule, batch / cfg.reference_batch), lr, rel_tol=1e-12
    ):
        return {"lr_scaling": rule}
    start = cfg.warmup_lr if cfg.warmup_lr is not None else cfg.base_lr
    return {"lr_scaling": "none", "base_lr": lr, "warmup_lr": start}


def row_keys(x: Inputs, batch: int) -> dict[str, Any]:
    """The keys over ``x.config`` of the run a row at ``batch`` plans: its batch and lr."""
    return {"batch_size": batch, **lr_keys(x.config, x.lr.rule, x.lr.at(batch), batch)}


@dataclass(frozen=True)
class Row:
    batch: int
    gpus: int
    micro_batch: int
    steps: float
    epochs: float
    lr: float
    warmup_steps: int
    compute_s: float
    allreduce_s: float
    step_s: float
    wall_s: float
    statistical_efficiency: float  # E_min / E(B)
    system_efficiency: float  # one worker's compute of the whole batch (the row's micro-batches)
    # over p × the step time: at most 1
    efficiency: float  # the product: the share of p workers' time that buys E_min's progress
    within_factor: bool  # E(B) ≤ E_FACTOR · E_min
    warning: str | None
    steps_range: tuple[float, float] | None = None  # the steps over the inputs' intervals
    extrapolated: tuple[str, ...] = ()  # what of the row lies beyond what was measured

    def as_dict(self) -> dict:
        return asdict(self)


def row(x: Inputs, batch: int, gpus: int) -> Row | None:
    """The plan's row for ``batch`` on ``gpus`` workers; None when the batch does not split."""
    if batch % gpus:
        return None
    per = batch // gpus
    micro = micro_batch(per, x.compute.max_micro, x.config.bn_batch)
    if micro is None:
        return None
    # its lr and warmup as the run derives them (a planned run measures no noise scale)
    keys = {**row_keys(x, batch), "noise_scale": False}
    d = derive(x.config.replace(**keys), gpus, x.train_samples, micro)
    steps = steps_to_target(batch, x.s_min, x.b_crit)
    step_s, t_c, t_comm = step_time(x.compute, per, micro, gpus, x.grad_bytes, x.link)
    stat = x.s_min * x.b_crit / (batch * steps)
    # one worker's compute of the whole batch in the row's own micro-batches: the same kernels,
    # so only the all-reduce, the shared machine and the sync cost efficiency (the largest
    # micro-batch one worker could take instead is another layout, and a one-group micro-batch
    # runs faster a sample than the line through larger ones: 1.29 and 1.59 against it)
    system = compute_time(x.compute, batch, micro)[0] / (gpus * step_s)
    return Row(
        batch=batch,
        gpus=gpus,
        micro_batch=micro,
        steps=steps,
        epochs=steps * batch / x.train_samples,
        lr=d.lr,
        warmup_steps=d.warmup_steps,
        compute_s=t_c,
        allreduce_s=t_comm,
        step_s=step_s,
        wall_s=steps * step_s,
        statistical_efficiency=stat,
        system_efficiency=system,
        efficiency=stat * system,
        within_factor=batch * steps <= E_FACTOR * x.s_min * x.b_crit * (1 + 1e-9),
        warning=row_warning(x, batch),
        steps_range=steps_range(x, batch),
        extrapolated=extrapolated(x, batch, gpus),
    )


CHECKED_UP_TO = 4.0  # study 16 checks the steps at batches up to this times B_crit


def row_warning(x: Inputs, batch: float) -> str | None:
    """The row's lr capped by the range test (the rule's own lr named), and the Adam family's
    warning above B_noise (:func:`lr_warning`), in a line."""
    lr = x.lr
    out = [lr_warning(x.config.optimizer, batch, x.b_crit)]
    if lr.capped(batch):
        out.append(
            f"lr capped at {lr.at(batch):.3g} by the lr range test (the {lr.rule} rule's "
            f"{lr.by_rule(batch):.3g})"
        )
    return "; ".join(w for w in out if w) or None


def noise_scales(x: Inputs, batch: float) -> tuple[float, ...]:
    """The B_noise values the plan allows at ``batch``: its B_crit, its interval's ends, and, where
    B_crit is a lower bound and the batch above the probe's, ∞ (perfect scaling) beside them:
    the interval's low end stays, so the side toward more steps is never cut."""
    out = (x.b_crit, *(x.b_crit_range or ()))
    if x.b_crit_lower and batch > (x.lr.anchor_batch):
        out = (*out, math.inf)
    return out


def steps_corners(x: Inputs, batch: float) -> tuple[float, float]:
    """The fewest and most steps of S(B) = S_ref (1 + B_crit/B)/(1 + B_crit/B_ref) over
    :func:`noise_scales` and the probe's steps (monotone in each: its corners)."""
    ref = x.lr.anchor_batch
    s_ref = x.s_min * (1 + x.b_crit / ref)
    refs = x.steps_range or (s_ref,)
    values = [_scaled(s, b, batch, ref) for b in noise_scales(x, batch) for s in refs]
    return min(values), max(values)


def lr_slack(x: Inputs, batch: float) -> float:
    """The most times the steps the row's lr may cost off the optimum (inf: no progress). The
    loss's drop a step is quadratic in the lr (McCandlish et al. eq. 2.6), so an lr r times the
    optimal makes r(2 − r) of its progress; the optimum is unknown as B_noise is: the saturating
    curve through the probe's point at each of :func:`noise_scales`, below the range test's bound."""
    lr, worst = x.lr, 1.0
    for b in noise_scales(x, batch):
        r = lr.at(batch) / min(lr.saturating(batch, b), lr.cap(batch))
        worst = max(worst, 1 / (r * (2 - r)) if r < 2 else math.inf)
    return worst


def steps_range(x: Inputs, batch: float) -> tuple[float, float] | None:
    """The row's steps over what the plan does not know (None: no interval measured): B_crit's
    and the probe's steps' (:func:`steps_corners`), the most of them × the lr's
    (:func:`lr_slack`). The figure and ``lbsgd plan --check`` show this interval."""
    if x.b_crit_range is None and x.steps_range is None:
        return None
    lo, hi = steps_corners(x, batch)
    return lo, hi * lr_slack(x, batch)


def _scaled(s_ref: float, b_crit: float, batch: float, ref: float) -> float:
    """S(B) through S(B_ref) = S_ref; perfect scaling at B_crit = ∞."""
    if math.isinf(b_crit):
        return s_ref * ref / batch
    return s_ref * (1 + b_crit / batch) / (1 + b_crit / ref)


def extrapolated(x: Inputs, batch: float, gpus: int) -> tuple[str, ...]:
    """What of a row no measurement stands behind: steps above the probe's batch where B_crit is
    a lower bound (B_simple still growing at the target), a batch past :data:`CHECKED_UP_TO` ×
    B_crit (beyond the batches study 16 checks), more processes than were timed at once."""
    out = []
    if x.b_crit_lower and batch > (x.lr.anchor_batch):
        out.append("B_crit a lower bound")
    if batch > CHECKED_UP_TO * x.b_crit:
        out.append(f"batch > {CHECKED_UP_TO:g} B_crit")
    if x.timed_gpus and gpus > x.timed_gpus:
        out.append(f"{gpus} GPUs > {x.timed_gpus} timed")
    return tuple(out)


def powers_of_two(lo: int, hi: int) -> list[int]:
    """The powers of two from the smallest ≥ ``lo`` to the largest ≤ ``hi``."""
    b = 1 << max(0, math.ceil(math.log2(lo)))
    out = []
    while b <= hi:
        out.append(b)
        b *= 2
    return out


def table(x: Inputs, batches: Sequence[int], gpus: Sequence[int]) -> list[Row]:
    """A row for every batch × GPU count whose batch splits into micro-batches of bn_batch."""
    rows = (row(x, b, p) for b in batches for p in gpus)
    return [r for r in rows if r is not None]


def recommend(rows: Sequence[Row]) -> Row | None:
    """The shortest predicted wall time among the rows whose compute stays within
    :data:`E_FACTOR` of the minimum (fewer GPUs, then the smaller batch, on a tie)."""
    ok = [r for r in rows if r.within_factor]
    if not ok:
        return None
    return min(ok, key=lambda r: (round(r.wall_s, 9), r.gpus, r.batch))
