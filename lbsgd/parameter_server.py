"""Asynchronous SGD with a parameter server (``async_ps=true``), under torchrun with K >= 2 processes.

Rank 0 is the server: it holds the weights W, the optimizer (the run's sgd or lars with its
velocity) and the step counter s. Ranks 1..K-1 are workers, which never wait for one another
(Dean et al. 2012's Downpour SGD; the asynchronous model of Lian et al. 2015, whose staleness τ is
measured here, where lbsgd.staleness simulates it)::

    worker k:  receive (W_v, v, j)           the weights of server step v, and a task j
               g = ∇L(W_v; batch j)          task j: the sampler's batch of step j
               send (g, v, j)
    server:    on the arrival of (g, v, j) from whichever worker sends first
               τ = s − v                     the staleness of g, in updates
               W ← W − step(g, η(s))         the optimizer at the lr of update s (schedules)
               s ← s + 1, send (W_s, s, next task) back to that worker

The run stops at s = total_steps.

One update = one worker's batch: ``batch_size`` is the batch of each gradient, so the lr rule,
warmup and schedule read it as for synchronous SGD (total_steps = epochs · N / batch_size updates);
a worker accumulates it in micro-batches of ``micro_batch``, with ghost-BN groups of ``bn_batch``.

Samples: the server hands out the tasks j = 0, 1, …, total_steps − 1 in order, each exactly once,
to whichever worker reports; task j is the batch of step j of a one-process sampler
(lbsgd.data.sampler), seeded (augmentation, dropout) by its stream positions as in a synchronous run.
So no sample repeats within an epoch and the run sees exactly the batches of synchronous SGD, applied
in the order they arrive, on weights τ updates old. Exactly total_steps gradients are computed and
each is applied; only after a divergence or a stop request are the ones in flight discarded. With
one worker (K = 2) τ = 0 always: synchronous SGD, one process, exactly.

BN running statistics: a worker sends the sums of its BN groups' statistics with its gradient; the
server folds them in at the update (lbsgd.models.ghost_bn's rule), so they are those of the applied
batches. The server evaluates alone, on the whole test split, at epoch ends (counted in applied
updates) and at the end, and writes one checkpoint, at the end.

Data: in-memory datasets (synthetic, cifar10) are indexed per task; a file dataset with
``workers`` > 0 starts its loader processes for every task (the next task is not known before the
server answers), which is slow: use workers=0 or an in-memory dataset.

Records: metrics.jsonl has one train record per applied update (step, lr, loss, staleness, worker,
task); summary.json has ``async_ps``: the staleness histogram, mean and maximum, and the updates per
worker. The arrival order depends on timing, so a run is not reproducible: resume is refused.
"""

from __future__ import annotations

import math
import signal
import time
from collections import Counter
from typing import Any

import torch

from lbsgd import checkpoint, data, distributed, models, optim, trainer
from lbsgd.config import Config, derive, dump
from lbsgd.environment import environment
from lbsgd.models import ghost_bn
from lbsgd.precision import Precision
from lbsgd.schedules import learning_rate
from lbsgd.tracking import Tracker

SERVER = 0
# Message tags. Worker → server: a report (int64: version v, task j, asked to stop) then the
# gradient (float32: loss, BN group sums, gradients). Server → worker: an order (int64: version s,
# task or STOP, status) then, unless it says STOP, the weights (float32).
TAG_REPORT, TAG_GRADIENT, TAG_ORDER, TAG_WEIGHTS = 0, 1, 2, 3
STOP = -1
STATUSES = ("running", "completed", "diverged", "interrupted")


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
    def __init__(self, cfg: Config, ctx: distributed.Context) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.stop_signal: str | None = None  # a stop signal this process caught (STOP_SIGNALS)
        # server only: the measured staleness of every applied update, and who sent it
        self.staleness: list[int] = []
        self.senders: list[int] = []

    def run(self) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        self.t_start = time.perf_counter()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        trainer._on_main(ctx, lambda: trainer.check_run_dir(cfg))  # resume=true: refused (config)
        self.run_dir = cfg.run_dir()
        self.splits = trainer._on_main(ctx, lambda: data.build(cfg), then_all=True)
        torch.manual_seed(cfg.seed)  # the same initialisation as a synchronous run
        net = models.build(cfg, self.splits.num_classes, self.splits.image_size)
        self.ghost = ghost_bn.ghost_modules(ghost_bn.convert(net, cfg.bn_batch))
        net.to(ctx.device)
        if cfg.channels_last:
            net.to(memory_format=torch.channels_last)
        self.net, self.params = net, list(net.parameters())
        self.precision = Precision(cfg.precision, ctx.device, cfg.loss_scale)
        micro = None
        if cfg.micro_batch == "auto":  # candidates of one worker's batch (config.check_world)
            micro = trainer.pick_micro_batch(cfg, ctx, net, self.splits, self.precision)
        self.d = derive(cfg, ctx.world_size, len(self.splits.train), micro)
        self.sampler = data.StepSampler(
            len(self.splits.train),
            cfg.batch_size,
            self.d.micro_batch,
            0,
            1,
            cfg.seed,
            self.d.total_steps,
        )
        self.group = distributed.p2p_group()
        # the messages' float32 payload: loss, BN group sums, gradients
        self.n_sums = sum(m.group_sums.numel() for m in self.ghost)
        self.n_params = sum(p.numel() for p in self.params)
        handlers = self._catch_stop_signals()
        try:
            return self._serve() if ctx.is_main else self._work()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _catch_stop_signals(self) -> dict:
        """Record STOP_SIGNALS instead of dying of them (a worker passes the request on in its
        next report; the server stops handing out tasks); returns the handlers they replace."""

        def record(signum, frame):
            self.stop_signal = signal.Signals(signum).name

        handlers = {}
        try:
            for sig in trainer.STOP_SIGNALS:
                handlers[sig] = signal.signal(sig, record)
        except ValueError:  # not the main thread: leave signals to whoever owns it
            pass
        return handlers

    # -- a worker ---------------------------------------------------------------------------------

    def _work(self) -> dict[str, Any]:
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
            payload = self._gradient(model, task)
            report.copy_(torch.tensor([version, task, int(self.stop_signal is not None)]))
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

    def _gradient(self, model: torch.nn.Module, task: int) -> torch.Tensor:
        """[mean loss, BN group sums, gradient] of task ``task`` (step ``task``'s batch of a
        one-process run, accumulated over its micro-batches), as one float32 CPU tensor."""
        cfg, d, device = self.cfg, self.d, self.ctx.device
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        stream = data.batches(
            self.splits.train,
            self.sampler.rank_batches(task),
            cfg.workers,
            pin=device.type == "cuda",
            seeds=(data.sample_seeds(2 * cfg.seed, p) for p in self.sampler.rank_positions(task)),
            device=device,
        )
        first = task * d.accum_steps  # the global micro-batch: dropout as in a synchronous run
        seeds = data.sample_seeds(2 * cfg.seed + 1, torch.arange(first, first + d.accum_steps))
        loss_sum = torch.zeros((), device=device)
        for i in range(d.accum_steps):
            trainer._seed(int(seeds[i]), device)
            x, y = next(stream)
            x = x.to(device, non_blocking=True, memory_format=fmt)
            y = y.to(device, non_blocking=True)
            with self.precision.autocast():
                loss = torch.nn.functional.cross_entropy(model(x), y)
            (loss / d.accum_steps).backward()
            loss_sum += loss.detach().float()
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

    def _order(self, worker: int, version: int, task: int, status: str = "running") -> None:
        """Send ``worker`` the current weights (of server step ``version``) and ``task``, or STOP."""
        order = torch.tensor([version, task, STATUSES.index(status)], dtype=torch.int64)
        distributed.send(order, worker, TAG_ORDER, self.group)
        if task != STOP:
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
            distributed.send(flat.to("cpu", torch.float32), worker, TAG_WEIGHTS, self.group)

    # -- the server -------------------------------------------------------------------------------

    def _serve(self) -> dict[str, Any]:
        cfg, ctx, d = self.cfg, self.ctx, self.d
        self.opt = optim.build(cfg, self.net)
        for p in self.params:  # the arriving gradients are copied here
            p.grad = torch.zeros_like(p)
        self.bn_stats = ghost_bn.RunningStats(self.ghost, groups=cfg.batch_size // cfg.bn_batch)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump(cfg, d))
        self.tracker = Tracker(
            self.run_dir,
            {**cfg.to_dict(), **d.to_dict()},
            mode=cfg.wandb,
            project=cfg.wandb_project,
            group=cfg.study,
            name=cfg.run_name(),
        )
        self._announce()
        self.summary: dict[str, Any] = {
            "status": "running",
            "run": cfg.run_name(),
            "study": cfg.study,
            "experiment_id": cfg.experiment_id(),
            "steps": 0,
            "total_steps": d.total_steps,
            "environment": {
                **environment(
                    ctx.device, ctx.world_size, cpu_isa=cfg.cpu_isa, train_split=self.splits.train
                ),
                "backend": distributed.backend_name(ctx.device, cfg.backend),
                "deterministic": torch.are_deterministic_algorithms_enabled(),
            },
        }
        self._write_summary()
        status = "failed"
        try:
            status = self._loop()
        finally:
            self.summary["status"] = status
            self._write_summary()
            self.tracker.summary(self.summary)
            self.tracker.close(exit_code=trainer.STATUS_EXIT_CODE.get(status, 1))
        return self.summary

    def _announce(self) -> None:
        cfg, d = self.cfg, self.d
        print(
            f"lbsgd: run {self.run_dir} | {cfg.model} on {cfg.dataset}, async_ps: server rank 0, "
            f"{d.world_size - 1} worker(s); one update = one worker's batch_size={cfg.batch_size}"
            f" = micro_batch={d.micro_batch} x accum_steps={d.accum_steps}\n"
            f"lbsgd: lr {cfg.base_lr} x {cfg.lr_scaling}({cfg.batch_size}/{cfg.reference_batch}) = "
            f"{d.lr:.6g}; warmup={cfg.warmup} from {d.warmup_start_lr:.6g} over {d.warmup_steps} "
            f"updates; schedule={cfg.schedule}; {d.total_steps} updates = {cfg.epochs:g} epochs x "
            f"{d.steps_per_epoch:.4g} updates/epoch (N={d.num_train})\n"
            f"lbsgd: {optim.describe_groups(self.opt)}",
            flush=True,
        )

    def _loop(self) -> str:
        """Hand out tasks, apply gradients as they arrive, until total_steps updates."""
        cfg, d = self.cfg, self.d
        b, n, total = cfg.batch_size, d.num_train, d.total_steps
        report = torch.zeros(3, dtype=torch.int64)
        payload = torch.empty(1 + self.n_sums + self.n_params, dtype=torch.float32)
        status, step, next_task, discarded = "running", 0, 0, 0
        active = set(range(1, d.world_size))
        for w in sorted(active):  # the first orders: the initial weights, tasks 0, 1, …
            if next_task < total:
                self._order(w, step, next_task)
                next_task += 1
            else:  # more workers than tasks
                self._order(w, step, STOP, "completed")
                active.discard(w)
        pending: list[dict[str, Any]] = []  # train records awaiting a flush
        t_other = 0.0  # seconds spent evaluating and checkpointing
        t_loop = t_window = time.perf_counter()
        while active:
            w = distributed.recv(report, None, TAG_REPORT, self.group)
            distributed.recv(payload, w, TAG_GRADIENT, self.group)
            version, task, asked = report.tolist()
            loss = float(payload[0])
            if asked and self.stop_signal is None:
                self.stop_signal = f"a stop signal at worker {w}"
            applied = status == "running" and math.isfinite(loss)
            if status == "running" and not applied:
                status = "diverged"
            if applied:
                tau = step - version  # updates applied since the worker took its weights
                lr = self._apply(step, payload)
                self.staleness.append(tau)
                self.senders.append(w)
                step += 1
                pending.append(
                    {
                        "kind": "train",
                        "step": step,
                        "epoch": step * b / n,
                        "lr": lr,
                        "loss": loss,
                        "staleness": tau,
                        "worker": w,
                        "task": task,
                    }
                )
            else:
                discarded += 1
            if status == "running" and self.stop_signal is not None and step < total:
                status = "interrupted"
            if status == "running" and next_task < total:
                self._order(w, step, next_task)
                next_task += 1
            else:
                self._order(w, step, STOP, "completed" if status == "running" else status)
                active.discard(w)
            if not applied:
                continue
            epoch_end = step * b // n > (step - 1) * b // n
            last = step == total
            if len(pending) >= cfg.log_every or epoch_end or last:
                now = time.perf_counter()
                self._flush(pending, b * len(pending) / max(now - t_window, 1e-9))
                pending, t_window = [], now
            epoch = step * b // n
            if last or (epoch_end and cfg.eval_every and epoch % cfg.eval_every == 0):
                t0 = time.perf_counter()
                self._evaluate(step)
                t_other += time.perf_counter() - t0
                t_window += time.perf_counter() - t0
            self.summary["steps"] = step
        if pending:
            now = time.perf_counter()
            self._flush(pending, b * len(pending) / max(now - t_window, 1e-9))
        train_time = time.perf_counter() - t_loop - t_other
        distributed.barrier()  # every worker has stopped: they may leave
        if status == "running":
            status = "completed"
        self.summary["steps"] = step
        self.summary["async_ps"] = {
            "workers": d.world_size - 1,
            "staleness": staleness_summary(self.staleness),
            "updates_per_worker": {str(w): c for w, c in sorted(Counter(self.senders).items())},
            "discarded_gradients": discarded,
        }
        self.summary.update(
            epochs=step * b / n,
            wall_time_s=time.perf_counter() - self.t_start,
            train_time_s=train_time,
            img_per_s=step * b / train_time if train_time > 0 else None,
        )
        if cfg.checkpoint and status != "diverged":
            self._save(step)
        if status == "diverged":
            print(f"lbsgd: run diverged (non-finite loss) after update {step}", flush=True)
        elif status == "interrupted":
            where = "checkpoint written" if cfg.checkpoint else "no checkpoint (checkpoint=false)"
            print(
                f"lbsgd: asked to stop ({self.stop_signal}): stopped after update {step}, "
                f"{where}; async_ps runs do not resume",
                flush=True,
            )
        return status

    def _apply(self, step: int, payload: torch.Tensor) -> float:
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

    def _flush(self, pending: list[dict[str, Any]], img_per_s: float) -> None:
        """Every update's record in metrics.jsonl; W&B: one point, the window's mean loss."""
        for rec in pending:
            rec["img_per_s"] = img_per_s
            self.tracker.log(rec, wandb=False)
        losses = [r["loss"] for r in pending]
        self.tracker.log_wandb({**pending[-1], "loss": sum(losses) / len(losses)})
        self.summary.setdefault("final", {})["train_loss"] = losses[-1]

    def _evaluate(self, step: int) -> None:
        """Top-1/top-5 error (%) and loss on the whole test split, on the server alone."""
        idx = torch.arange(len(self.splits.test))
        sums = trainer.evaluation_sums(
            self.net,
            self.splits,
            idx,
            4 * self.d.micro_batch,
            self.cfg,
            self.ctx.device,
            self.precision,
        )
        rec = trainer.evaluation_record(step, sums, self.cfg.batch_size, self.d.num_train)
        self.tracker.log(rec)
        trainer.note_evaluation(self.summary, rec)

    def _save(self, step: int) -> None:
        """The server's state after update ``step``: a record of the run's end (no resume)."""
        checkpoint.save(
            self.run_dir,
            {
                "model": self.net.state_dict(),
                "optimizer": self.opt.state_dict(),
                "step": step,
                "num_train": self.d.num_train,
                "world_size": self.ctx.world_size,
                "config": self.cfg.to_dict(),
                "summary": {
                    k: self.summary[k] for k in ("best", "final", "async_ps") if k in self.summary
                },
            },
        )

    def _write_summary(self) -> None:
        trainer.write_summary(self.run_dir, self.summary)
