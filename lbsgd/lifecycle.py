"""What the two loops share of a run's life, as functions each calls (no base class): the
synchronous loop (:mod:`lbsgd.trainer`) and the asynchronous parameter server
(:mod:`lbsgd.parameter_server`) start a process alike, build the same data, network and sampler,
run a micro-batch's forward alike, announce the same schedule, record an evaluation, save the same
core of a checkpoint and end a run with the same last lines. Each loop still reads alone: it calls
these in its own order, with what only it does between them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lbsgd import data, distributed, models, rundir, seeding
from lbsgd.config import Config, Derived, derive, warmup_warning
from lbsgd.evaluation import evaluation_record, evaluation_sums, note_evaluation
from lbsgd.models import ghost_bn
from lbsgd.network import pick_micro_batch
from lbsgd.precision import Precision
from lbsgd.progress import ending_line
from lbsgd.rundir import Status
from lbsgd.tracking import Tracker


def begin(cfg: Config) -> float:
    """A process's run starts: its wall clock (``perf_counter()``, the summary's wall_time_s
    counts from it) and its thread count (``threads``)."""
    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return t_start


@dataclass
class Built:
    """A run's data, network and sampler, made alike by both loops."""

    splits: data.Splits
    net: torch.nn.Module  # initialised from the seed alone
    ghost: list[torch.nn.Module]  # its ghost-BN modules
    precision: Precision
    d: Derived
    sampler: data.StepSampler


def build(cfg: Config, ctx: distributed.Context, rank: int, world_size: int) -> Built:
    """The data (rank 0 fills the caches, then the others read them), the network initialised
    from ``cfg.seed`` alone (the same on every rank and for every batch size), BN converted to
    ghost BN, on the device, the derived values (with the micro-batch of ``micro_batch=auto``) and
    the step sampler of ``world_size`` processes seen from ``rank`` (the parameter server's: one
    process, task j the batch of step j)."""
    splits = distributed.on_main(ctx, lambda: data.build(cfg), then_all=True)
    torch.manual_seed(seeding.initial_weights(cfg.seed))
    net = models.build(cfg, splits.num_classes, splits.image_size)
    ghost = ghost_bn.ghost_modules(ghost_bn.convert(net, cfg.bn_batch))
    net.to(ctx.device)
    if cfg.channels_last:
        net.to(memory_format=torch.channels_last)
    precision = Precision(cfg.precision, ctx.device, cfg.loss_scale)
    auto = cfg.micro_batch == "auto"
    micro = pick_micro_batch(cfg, ctx, net, splits, precision) if auto else None
    d = derive(cfg, ctx.world_size, len(splits.train), micro)
    sampler = data.StepSampler(
        num_samples=len(splits.train),
        batch_size=cfg.batch_size,
        micro_batch=d.micro_batch,
        rank=rank,
        world_size=world_size,
        seed=cfg.seed,
        total_steps=d.total_steps,
    )
    return Built(splits, net, ghost, precision, d, sampler)


def micro_batch_seeds(cfg: Config, d: Derived, first: int) -> torch.Tensor:
    """The seeds of the ``accum_steps`` global micro-batches from ``first``: randomness inside a
    step (dropout) drawn from them is the same on any layout and after a resume."""
    return seeding.micro_batches(cfg.seed, torch.arange(first, first + d.accum_steps))


def micro_batch_loss(
    model: torch.nn.Module, stream, device: torch.device, fmt, precision: Precision
) -> torch.Tensor:
    """The next micro-batch of ``stream`` on ``device`` (inputs in memory format ``fmt``), its
    forward under the run's precision and its cross-entropy loss."""
    x, y = next(stream)
    x = x.to(device, non_blocking=True, memory_format=fmt)
    y = y.to(device, non_blocking=True)
    with precision.autocast():
        return torch.nn.functional.cross_entropy(model(x), y)


def announce(cfg: Config, d: Derived, layout: str, unit: str = "steps", tail: str = "") -> None:
    """Rank 0's lines as training starts: the warmup's warning, where it has one
    (:func:`lbsgd.config.warmup_warning`), then the run, its ``layout`` and its lr, warmup and
    schedule (``unit``: what a step is called), then ``tail``."""
    if (warning := warmup_warning(cfg, d)) is not None:
        print(warning, flush=True)
    print(
        f"lbsgd: run {cfg.run_dir()} | {cfg.model} on {cfg.dataset}, {layout}\n"
        f"lbsgd: lr {cfg.base_lr} x {cfg.lr_scaling}({cfg.batch_size}/{cfg.reference_batch}) = "
        f"{d.lr:.6g}; warmup={cfg.warmup} from {d.warmup_start_lr:.6g} over {d.warmup_steps} "
        f"{unit}; schedule={cfg.schedule}; {d.total_steps} {unit} = {cfg.epochs:g} epochs x "
        f"{d.steps_per_epoch:.4g} {unit}/epoch (N={d.num_train})" + tail,
        flush=True,
    )


def evaluate(
    model: torch.nn.Module,
    built: Built,
    cfg: Config,
    ctx: distributed.Context,
    step: int,
    only: str | None,
    tracker: Tracker | None,
    summary: rundir.Summary,
    sharded: bool = True,
) -> dict[str, Any]:
    """Top-1/top-5 error (%) and loss of the test split (and the held-out split; ``only``: that
    split alone) after step ``step``: ``sharded``, each rank a disjoint shard, the sums added in
    one all-reduce; else the whole splits on this process. The evaluation's record, written to
    metrics.jsonl (where this process tracks) and to the summary's final and best."""
    shard = {"rank": ctx.rank, "world_size": ctx.world_size} if sharded else {}
    sums = evaluation_sums(
        model,
        built.splits,
        4 * built.d.micro_batch,
        cfg,
        ctx.device,
        built.precision,
        only=only,
        **shard,
    )
    if sharded:
        sums = distributed.all_reduce_sum(sums)
    rec = evaluation_record(step, built.sampler.epoch_of(step), sums, only)
    if tracker is not None:
        tracker.log(rec)
    note_evaluation(summary, rec)
    return rec


def checkpoint_core(
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    step: int,
    d: Derived,
    world_size: int,
    cfg: Config,
) -> dict[str, Any]:
    """What every checkpoint holds: the model, the optimizer, the step, the train split's size,
    the processes and the keys."""
    return {
        "model": net.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "num_train": d.num_train,
        "world_size": world_size,
        "config": cfg.to_dict(),
    }


def conclude(
    summary: rundir.Summary,
    status: Status,
    run_dir: Path,
    tracker: Tracker | None,
    walls: dict[str, Any],
    is_main: bool = True,
) -> None:
    """The run's end: its status (and a failed run's wall time, ``walls``: its loop did not time
    itself) into summary.json, the tracker closed with the status's exit code, and rank 0's last
    line saying how the run ended."""
    summary["status"] = status
    if "wall_time_s" not in summary:
        summary.update(walls)  # type: ignore[typeddict-item]
    if is_main:
        rundir.write_summary(run_dir, summary)
    if tracker is not None:
        tracker.summary(summary)
        tracker.close(exit_code=rundir.STATUS_EXIT_CODE.get(status, 1))
    if is_main:
        print(ending_line(summary, run_dir), flush=True)
