"""Asynchronous SGD with a parameter server (``async_ps=true``), under torchrun with K >= 2 processes.

Rank 0 is the server (the weights, the run's optimizer, the update counter s); ranks 1..K-1 are
workers that never wait for one another (Dean et al. 2012's Downpour SGD). The server applies each
gradient as it arrives, with staleness τ = s − v updates, and hands out the sampler's batches of
steps 0, 1, … in order, each once: the run sees synchronous SGD's batches, applied out of order on
stale weights; with one worker (K = 2) it is synchronous SGD. The arrival order depends on timing,
so a run does not repeat and resume is refused. docs/communication.md says what it records."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from lbsgd import checkpoint, data, distributed, lifecycle, optim, rundir, seeding
from lbsgd.cadence import Cadence, StopSignals, WindowClock, decide
from lbsgd.config import Config, Derived
from lbsgd.models import ghost_bn
from lbsgd.network import memory_format
from lbsgd.precision import Precision
from lbsgd.progress import Flushed, Progress
from lbsgd.rundir import Status, new_summary, open_run_dir
from lbsgd.schedules import learning_rate
from lbsgd.tracking import Tracker

SERVER = 0
# Message tags. Worker → server: a report (int64: version v, task j, asked to stop) then the
# gradient (float32: loss, BN group sums, gradients). Server → worker: an order (int64: version s,
# task or STOP, status) then, unless it says STOP, the weights (float32).
TAG_REPORT, TAG_GRADIENT, TAG_ORDER, TAG_WEIGHTS = 0, 1, 2, 3
STOP = -1
STATUSES = (Status.RUNNING, Status.COMPLETED, Status.DIVERGED, Status.INTERRUPTED)


def staleness_summary(values: list[int]) -> dict[str, Any]:
    """Histogram (τ → count, in increasing τ), mean and maximum of measured staleness values."""
    counts = Counter(values)
    return {
        "histogram": {str(t): counts[t] for t in sorted(counts)},
        "mean": sum(values) / len(values) if values else None,
        "max": max(values) if values else None,
    }


def _views(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut into tensors shaped like ``like`` (views)."""
    parts = flat.split([t.numel() for t in like])
    return [p.view(t.shape) for p, t in zip(parts, like, strict=True)]


class Run:
    """An ``async_ps`` run on this process: rank 0 serves (:meth:`serve`), the others work
    (:meth:`work`). Built as a synchronous run is (:func:`lbsgd.lifecycle.build`), with a
    one-process sampler whose step j is task j."""

    cfg: Config
    ctx: distributed.Context
    run_dir: Path  # cfg.run_dir(): the server writes there
    t_start: float  # perf_counter() when run() began (summary's wall_time_s)
    stop: StopSignals  # a stop signal this process caught, or (server) one a worker reported
    built: lifecycle.Built  # the data, network and sampler, made as a synchronous run's
    splits: data.Splits
    net: torch.nn.Module  # the raw module: the server's weights W, a worker's copy of W_v
    params: list[torch.Tensor]  # net's parameters, in the order of the messages
    ghost: list[torch.nn.Module]  # net's ghost-BN modules (their group sums travel)
    precision: Precision
    d: Derived
    sampler: data.StepSampler  # one process: task j is the batch of step j
    group: Any  # the process group of the point-to-point messages
    n_sums: int  # float32 payload: loss, then n_sums BN group sums, then n_params gradients
    n_params: int
    # the server's
    opt: torch.optim.Optimizer
    bn_stats: ghost_bn.RunningStats
    # when to flush and evaluate (lbsgd.cadence.decide; one checkpoint, at the end)
    cadence: Cadence
    tracker: Tracker
    summary: rundir.Summary  # summary.json's content
    status: Status  # one of STATUSES
    step: int  # updates applied: the server step s
    next_task: int  # the next task to hand out
    discarded: int  # gradients that arrived after a divergence or a stop
    pending: list[dict[str, Any]]  # train records awaiting a flush
    staleness: list[int]  # the measured staleness of every applied update
    senders: list[int]  # the worker that sent each applied update

    def __init__(self, cfg: Config, ctx: distributed.Context) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.run_dir = cfg.run_dir()
        self.stop = StopSignals()
        self.staleness, self.senders = [], []

    def run(self) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        self.t_start = lifecycle.begin(cfg)
        distributed.on_main(ctx, lambda: rundir.check_run_dir(cfg, ctx.world_size))  # no resume
        # the same initialisation as a synchronous run; micro_batch=auto: candidates of one
        # worker's batch (config.check_world); a one-process sampler: task j is step j's batch
        self.built = b = lifecycle.build(cfg, ctx, rank=0, world_size=1)
        self.splits, self.net, self.ghost, self.precision = b.splits, b.net, b.ghost, b.precision
        self.d, self.sampler = b.d, b.sampler
        self.params = list(self.net.parameters())
        self.group = distributed.p2p_group()
        # the messages' float32 payload: loss, BN group sums, gradients
        self.n_sums = sum(m.group_sums.numel() for m in self.ghost)
        self.n_params = sum(p.numel() for p in self.params)
        # a worker passes a stop request on in its next report; the server stops handing out tasks
        with self.stop:
            return self.serve() if ctx.is_main else self.work()

    # -- a worker ---------------------------------------------------------------------------------

    def work(self) -> dict[str, Any]:
        """Until the server says STOP: take the weights and a task, send the task's gradient."""
        order = torch.zeros(3, dtype=torch.int64)
        weights = torch.empty(self.n_params, dtype=torch.float32)
        report = torch.zeros(3, dtype=torch.int64)
        model = torch.compile(self.net) if self.cfg.compile else self.net
        model.train()
        done = 0
        while True:
            distributed.recv(order, SERVER, TAG_ORDER, self.group)
            version, task, status = order.tolist()
            if task == STOP:
                break
            distributed.recv(weights, SERVER, TAG_WEIGHTS, self.group)
            with torch.no_grad():
                torch._foreach_copy_(self.params, _views(weights.to(self.ctx.device), self.params))
            payload = self.gradient(model, task)
            report.copy_(torch.tensor([version, task, int(self.stop.caught is not None)]))
            distributed.send(report, SERVER, TAG_REPORT, self.group)
            distributed.send(payload, SERVER, TAG_GRADIENT, self.group)
            done += 1
        distributed.barrier()  # the run's end: no process leaves while another still talks
        return {
            "status": STATUSES[status],
            "role": "worker",
            "rank": self.ctx.rank,
            "gradients": done,
        }

    def gradient(self, model: torch.nn.Module, task: int) -> torch.Tensor:
        """[mean loss, BN group sums, gradient] of task ``task`` (step ``task``'s batch of a
        one-process run, accumulated over its micro-batches), as one float32 CPU tensor."""
        cfg, d, device = self.cfg, self.d, self.ctx.device
        fmt = memory_format(cfg)
        stream = data.batches(
            self.splits.train,
            self.sampler.rank_batches(task),
            cfg.workers,
            pin=device.type == "cuda",
            seeds=(seeding.augmentation(cfg.seed, p) for p in self.sampler.rank_positions(task)),
            device=device,
        )
        # the global micro-batches: dropout as in a synchronous run
        seeds = lifecycle.micro_batch_seeds(cfg, d, task * d.accum_steps)
        loss_sum = torch.zeros((), device=device)
        for i in range(d.accum_steps):
            seeding.seed_generators(int(seeds[i]), device)
            loss = lifecycle.micro_batch_loss(model, stream, device, fmt, self.precision)
            (loss / d.accum_steps).backward()
            loss_sum += loss.detach().float()
        # the payload; then the gradients and the BN sums zeroed for the next task
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        sums = [m.group_sums for m in self.ghost]
        payload = torch.cat(
            [
                (loss_sum / d.accum_steps).reshape(1),
                *(t.reshape(-1) for t in sums),
                *(g.reshape(-1) for g in grads),
            ]
        )
        payload = payload.to("cpu", torch.float32)
        self.net.zero_grad(set_to_none=True)
        with torch.no_grad():  # the next task starts clean (RunningStats.commit's reset)
            torch._foreach_zero_(sums)
            scratch = [m._stats for m in self.ghost if m._stats is not None]
            if scratch:
                torch._foreach_zero_(scratch)
        return payload

    def _order(self, worker: int, version: int, task: int, status: Status = Status.RUNNING) -> None:
        """Send ``worker`` the current weights (of server step ``version``) and ``task``, or STOP."""
        order = torch.tensor([version, task, STATUSES.index(status)], dtype=torch.int64)
        distributed.send(order, worker, TAG_ORDER, self.group)
        if task != STOP:
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
            distributed.send(flat.to("cpu", torch.float32), worker, TAG_WEIGHTS, self.group)

    # -- the server -------------------------------------------------------------------------------

    def serve(self) -> dict[str, Any]:
        """The server's run: optimizer, run directory and tracker, the loop, the summary."""
        cfg, ctx, d = self.cfg, self.ctx, self.d
        self.opt = optim.build(cfg, self.net)
        for p in self.params:  # the arriving gradients are copied here
            p.grad = torch.zeros_like(p)
        self.bn_stats = ghost_bn.RunningStats(self.ghost, groups=d.bn_groups)
        # flushes and evaluations as a synchronous run's; the one checkpoint: at the end
        cadence = Cadence.of(cfg, d.total_steps, self.sampler.epoch_of)
        self.cadence = dataclasses.replace(cadence, checkpoint=False)
        self.tracker = open_run_dir(cfg, d)
        lifecycle.announce(
            cfg,
            d,
            f"async_ps: server rank 0, {d.world_size - 1} worker(s); one update = one worker's "
            f"batch_size={cfg.batch_size} = micro_batch={d.micro_batch} x accum_steps={d.accum_steps}",
            "updates",
            f"\nlbsgd: {optim.describe_groups(self.opt)}",
        )
        self.summary = new_summary(cfg, ctx, d, self.splits, 0)
        rundir.write_summary(self.run_dir, self.summary)
        status = Status.FAILED
        try:
            status = self.loop()
        finally:
            # a failed run's loop did not time itself: its wall time still goes in
            walls = {"wall_time_s": time.perf_counter() - self.t_start}
            lifecycle.conclude(self.summary, status, self.run_dir, self.tracker, walls)
        return self.summary

    def loop(self) -> Status:
        """Hand out tasks, apply gradients as they arrive, until total_steps updates."""
        self.status, self.step, self.next_task, self.discarded = Status.RUNNING, 0, 0, 0
        self.pending = []
        report = torch.zeros(3, dtype=torch.int64)
        payload = torch.empty(1 + self.n_sums + self.n_params, dtype=torch.float32)
        active = set(range(1, self.d.world_size))
        for w in sorted(active):  # the first orders: the initial weights, tasks 0, 1, …
            self._answer(w, active)  # (more workers than tasks: STOP, "completed")
        clock = WindowClock()
        # tqdm's bar on a terminal, else plain lines
        progress = Progress(self.d.total_steps, 0, self.sampler.epoch_of, True, self.t_start)
        while active:
            w = distributed.recv(report, None, TAG_REPORT, self.group)
            distributed.recv(payload, w, TAG_GRADIENT, self.group)
            applied = self._receive(w, report, payload)
            self._answer(w, active)
            if applied:
                progress.step()
                self._after_update(clock, progress)
        if self.pending:
            self._close_window(clock, progress)
        progress.close()
        return self._conclude(clock.elapsed())

    def _receive(self, w: int, report: torch.Tensor, payload: torch.Tensor) -> bool:
        """Worker ``w``'s gradient: applied while the run goes on and its loss is finite (a
        non-finite one: the run diverged), else discarded. Whether it was applied."""
        version, task, asked = report.tolist()
        loss = float(payload[0])
        if asked and self.stop.caught is None:
            self.stop.caught = f"a stop signal at worker {w}"
        applied = self.status == Status.RUNNING and math.isfinite(loss)
        if self.status == Status.RUNNING and not applied:
            self.status = Status.DIVERGED
        if applied:
            self._update(w, version, task, loss, payload)
        else:
            self.discarded += 1
        stopping = self.stop.caught is not None and self.step < self.d.total_steps
        if self.status == Status.RUNNING and stopping:
            self.status = Status.INTERRUPTED
        return applied

    def _update(self, w: int, version: int, task: int, loss: float, payload) -> None:
        """Apply the gradient as update ``step``; its staleness and its train record."""
        tau = self.step - version  # updates applied since the worker took its weights
        lr = self.apply(self.step, payload)
        self.staleness.append(tau)
        self.senders.append(w)
        self.step += 1
        self.pending.append(
            {
                "kind": "train",
                "step": self.step,
                "epoch": self.sampler.epoch_of(self.step),
                "lr": lr,
                "loss": loss,
                "staleness": tau,
                "worker": w,
                "task": task,
            }
        )

    def _answer(self, w: int, active: set[int]) -> None:
        """The current weights and the next task to worker ``w``; STOP (with the run's status)
        when the run no longer goes on or every task is handed out."""
        if self.status == Status.RUNNING and self.next_task < self.d.total_steps:
            self._order(w, self.step, self.next_task)
            self.next_task += 1
            return
        self._order(
            w, self.step, STOP, Status.COMPLETED if self.status == Status.RUNNING else self.status
        )
        active.discard(w)

    def _after_update(self, clock: WindowClock, progress: Progress) -> None:
        """The decisions after an applied update (lbsgd.cadence.decide): flush, evaluate; then a
        plain progress line, when one is due."""
        plan = decide(self.cadence, self.step, len(self.pending))
        if plan.flush:
            self._close_window(clock, progress)
        top1_error = None
        if plan.evaluate or plan.probe:
            with clock.set_aside():  # evaluation is not training time
                if plan.evaluate:
                    top1_error = self.evaluate(self.step)["top1_error_pct"]
                else:
                    self.evaluate(self.step, "val" if self.splits.val is not None else "test")
        self.summary["steps"] = self.step
        progress.report(self.step, plan.boundary, top1_error)

    def _close_window(self, clock: WindowClock, progress: Progress) -> None:
        img_per_s = clock.close_window(self.cfg.batch_size * len(self.pending))
        self.flush(self.pending, img_per_s)
        last = self.pending[-1]
        progress.flushed(Flushed(last["step"], last["loss"], last["lr"], img_per_s))
        self.pending = []

    def _conclude(self, train_time: float) -> Status:
        """After the last worker stopped: the summary, the checkpoint, the run's status."""
        cfg, d, step = self.cfg, self.d, self.step
        distributed.barrier()  # every worker has stopped: they may leave
        status = Status.COMPLETED if self.status == Status.RUNNING else self.status
        self.summary["steps"] = step
        self.summary["async_ps"] = {
            "workers": d.world_size - 1,
            "staleness": staleness_summary(self.staleness),
            "updates_per_worker": {str(w): c for w, c in sorted(Counter(self.senders).items())},
            "discarded_gradients": self.discarded,
        }
        self.summary.update(
            epochs=self.sampler.epoch_of(step),
            wall_time_s=time.perf_counter() - self.t_start,
            train_time_s=train_time,
            img_per_s=step * cfg.batch_size / train_time if train_time > 0 else None,
        )
        if cfg.checkpoint and status != Status.DIVERGED:
            self.save(step)
        if status == Status.DIVERGED:
            print(f"lbsgd: run diverged (non-finite loss) after update {step}", flush=True)
        elif status == Status.INTERRUPTED:
            where = "checkpoint written" if cfg.checkpoint else "no checkpoint (checkpoint=false)"
            print(
                f"lbsgd: asked to stop ({self.stop.caught}): stopped after update {step}, "
                f"{where}; async_ps runs do not resume",
                flush=True,
            )
        return status

    def apply(self, step: int, payload: torch.Tensor) -> float:
        """Update ``step`` (0-based) with the gradient and BN group sums in ``payload``; returns
        its learning rate."""
        lr = learning_rate(step, self.cfg, self.d)
        optim.set_lr(self.opt, lr)
        flat = payload.to(self.ctx.device)
        sums = [m.group_sums for m in self.ghost]
        with torch.no_grad():
            torch._foreach_copy_(sums, _views(flat[1 : 1 + self.n_sums], sums))
            grads = [p.grad for p in self.params]
            torch._foreach_copy_(grads, _views(flat[1 + self.n_sums :], grads))
        self.opt.step()
        self.bn_stats.commit()  # the running statistics of this update's batch
        return lr

    def flush(self, pending: list[dict[str, Any]], img_per_s: float) -> None:
        """Every update's record in metrics.jsonl; W&B: one point, the window's mean loss."""
        for rec in pending:
            rec["img_per_s"] = img_per_s
            self.tracker.log(rec, wandb=False)
        losses = [r["loss"] for r in pending]
        self.tracker.log_wandb({**pending[-1], "loss": sum(losses) / len(losses)})
        self.summary.setdefault("final", {})["train_loss"] = losses[-1]

    def evaluate(self, step: int, only: str | None = None) -> dict[str, Any]:
        """Top-1/top-5 error (%) and loss on the whole test split (and the whole held-out split,
        with ``holdout``; ``only``: that split alone), on the server alone; the evaluation's
        record."""
        return lifecycle.evaluate(
            self.net, self.built, self.cfg, self.ctx, step, only, self.tracker, self.summary, False
        )

    def save(self, step: int) -> None:
        """The server's state after update ``step``: a record of the run's end (no resume)."""
        checkpoint.save(
            self.run_dir,
            {
                **lifecycle.checkpoint_core(
                    self.net, self.opt, step, self.d, self.ctx.world_size, self.cfg
                ),
                "summary": {
                    k: self.summary[k] for k in ("best", "final", "async_ps") if k in self.summary
                },
            },
        )
