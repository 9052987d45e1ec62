"""The synchronous training loop: composes config, data, model, optimizer, schedule and tracking;
holds no policy. Its entry, :func:`lbsgd.entry.train`, dispatches here (or to the parameter server).

One loop serves one process and ``torchrun`` with N processes alike. Per optimizer step each process
runs ``accum_steps`` micro-batches of ``micro_batch`` samples; gradients are averaged over the global
batch kn by scaling each micro-batch loss by 1/accum_steps and letting DDP average over the
processes on the last micro-batch (``no_sync`` on the others, so one all-reduce per step).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from lbsgd import checkpoint, data, distributed, features, lifecycle, optim, rundir, seeding
from lbsgd.cadence import Cadence, StopSignals, WindowClock, decide
from lbsgd.config import Config, ConfigError, Derived
from lbsgd.evaluation import target_reached
from lbsgd.features import Pending, Reduced, pack_flush, unpack_flush
from lbsgd.models import ghost_bn
from lbsgd.network import backward_without_trace, memory_format
from lbsgd.precision import Precision
from lbsgd.progress import Flushed, Progress, ending_line
from lbsgd.rundir import Status, new_summary, open_run_dir
from lbsgd.schedules import learning_rate
from lbsgd.tracking import Tracker

# Optimizer steps timed apart as the settling steps (compilation, autotuning, allocator growth) at
# the start of each process run: summary.json's warmup_steps_timed and warmup_s
SETTLING_STEPS = 3


class Run:
    """One synchronous training run, in phases: :meth:`build` (data, network, optimizer, sampler),
    :meth:`restore` (a checkpoint, on resume), :meth:`attach` (what the step carries besides the
    network: the step features of lbsgd.features, DDP and its hook), :meth:`start` (the run
    directory, the tracker, the summary), :meth:`loop` (train steps, each followed by the
    decisions of :func:`lbsgd.cadence.decide`), :meth:`finish` (status and summary written).

    Everything a run holds is declared here; a phase sets what its comment names.
    """

    cfg: Config
    ctx: distributed.Context
    run_dir: Path  # cfg.run_dir(): rank 0 writes there
    t_start: float  # perf_counter() when run() began (summary's wall_time_s)
    # the wall time of the run's earlier attempts (a resumed run's) and how many there were
    earlier_wall_s: float = 0.0
    earlier_attempts: int = 0
    stop: StopSignals  # a stop signal this process caught (acted on at the next flush)
    stop_agreed: bool = False  # set by each flush: some process was asked to stop
    # build
    built: lifecycle.Built  # the data, network and sampler (lifecycle.build, as the server's)
    splits: data.Splits
    net: torch.nn.Module  # the raw module: its parameters, buffers and state_dict are the run's
    eval_model: torch.nn.Module  # net, compiled when cfg.compile: what evaluation calls (attach)
    model: torch.nn.Module  # eval_model, DDP-wrapped on > 1 process: what the step calls (attach)
    ghost: list[torch.nn.Module]  # net's ghost-BN modules (their running statistics: bn_stats)
    precision: Precision  # autocast, loss scaling, skipped steps
    d: Derived  # derived values: micro_batch, accum_steps, total_steps, lr, warmup, num_train
    opt: torch.optim.Optimizer
    sampler: data.StepSampler  # which samples each step and rank reads; epoch_of: the epoch
    cadence: Cadence  # when to flush, evaluate, checkpoint (lbsgd.cadence.decide)
    # restore
    start_step: int = 0  # the step the loop starts at: 0, or the checkpoint's
    # attach
    features: list[features.StepFeature]  # the step features, in the order they are called
    comm_state: Any  # comm_hook's state (PowerSGD's memories), None without one
    # start
    tracker: Tracker | None = None  # metrics.jsonl and W&B: rank 0 only
    summary: rundir.Summary  # summary.json's content, rewritten at the start and at the end

    def __init__(self, cfg: Config, ctx: distributed.Context) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.run_dir = cfg.run_dir()
        self.stop = StopSignals()
        self.summary = {}

    def run(self) -> dict[str, Any]:
        """Train to the end (or until it diverges or is asked to stop); returns the summary."""
        cfg, ctx = self.cfg, self.ctx
        self.t_start = lifecycle.begin(cfg)
        mode = distributed.on_main(ctx, lambda: rundir.check_run_dir(cfg, ctx.world_size))
        if mode == "completed":
            summary = rundir.read_summary(self.run_dir)
            if ctx.is_main:
                print(f"lbsgd: {self.run_dir} is already complete; nothing to do", flush=True)
                print(ending_line(summary, self.run_dir), flush=True)
            return summary
        try:
            self.build()
            state = checkpoint.load_agreed(ctx, cfg, self.sampler) if mode == "resume" else None
            resumed = self.restore(state)
            self.attach(state)
            self.start(resumed, truncate=mode == "resume")
        except ConfigError:
            raise  # a refusal, in one line of its own: no run began
        except BaseException as e:
            self.ended_before_training(
                Status.INTERRUPTED if isinstance(e, KeyboardInterrupt) else Status.FAILED
            )
            raise
        status = Status.FAILED
        try:
            with self.stop:
                status = self.loop()
        finally:
            self.finish(status)
        return self.summary

    # -- build, restore, attach, start -------------------------------------------------------------

    def build(self) -> None:
        """Data (rank 0 fills the caches, then the others read them), the network initialised
        from the seed alone, the optimizer, the sampler and the cadences."""
        cfg, ctx = self.cfg, self.ctx
        self.built = b = lifecycle.build(cfg, ctx, ctx.rank, ctx.world_size)
        self.splits, self.net, self.ghost, self.precision = b.splits, b.net, b.ghost, b.precision
        self.d, self.sampler = b.d, b.sampler
        self.opt = optim.build(cfg, self.net)
        self.cadence = Cadence.of(cfg, self.d.total_steps, self.sampler.epoch_of)

    def restore(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """Network, optimizer, loss scaler and this rank's RNG states from ``state`` (None: a new
        run; the step features' state: :meth:`attach`); returns the summary's best/final evaluations before the checkpoint."""
        if state is None:
            return {}
        ctx = self.ctx
        self.net.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state.get("precision", {}))
        ranks = state.get("ranks")
        mine = checkpoint.rank_state(state, ctx)
        if mine is not None:
            checkpoint.set_rng_state(mine, ctx.device)
        elif "rng" in state:  # format 1
            torch.set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        if ctx.is_main:
            note = ""
            if ranks and len(ranks) != ctx.world_size:
                note = f" (saved by {len(ranks)} processes, resumed on {ctx.world_size})"
            print(
                f"lbsgd: resuming from {state.get('file')} at step {self.start_step}{note}",
                flush=True,
            )
        return state.get("summary", {})

    def attach(self, state: dict[str, Any] | None) -> None:
        """What the step carries besides the network: the step features (lbsgd.features), in the
        order of the step features' table, and DDP with the run's comm hook, which hands its
        buckets to a feature's bucket reader; each feature's state restored from ``state`` if
        given."""
        cfg, ctx, d, params = self.cfg, self.ctx, self.d, list(self.net.parameters())
        parts = features.Parts(cfg=cfg, d=d, params=params, ctx=ctx)
        before = features.made("before_wrap", parts)
        readers = [r for f in before if (r := f.bucket_reader()) is not None]
        assert len(readers) <= 1, "DDP's comm hook hands its buckets to one reader"
        # torch.compile, then DDP with the run's comm hook, which hands each bucket to the reader
        self.eval_model = torch.compile(self.net) if cfg.compile else self.net
        self.model = distributed.wrap(
            self.eval_model,
            ctx,
            cfg.bucket_cap_mb,
            cfg.comm_hook,
            cfg.powersgd_rank,
            d.switch_step,
            readers[0] if readers else None,
        )
        self.comm_state = getattr(self.model, "comm_state", None)
        parts.opt, parts.model, parts.comm_state = self.opt, self.model, self.comm_state
        parts.start_step, parts.rebuild = self.start_step, self._throwaway_backward
        self.features = features.in_order(before + features.made("after_wrap", parts))
        if state is not None:
            mine = checkpoint.rank_state(state, ctx) or {}
            features.restore(self.features, state, mine, state.get("file", "checkpoint"))
        for f in self.features:
            f.announce()

    def start(self, resumed: dict[str, Any], truncate: bool) -> None:
        """Rank 0: the run directory, its config.yaml, the tracker (on resume: metrics after the
        checkpoint's step dropped). Every rank: the summary, with ``resumed``'s evaluations."""
        cfg, ctx, d = self.cfg, self.ctx, self.d
        resumed = dict(resumed)
        saved = {k: resumed.pop(k) for k in ("total_wall_time_s", "attempts") if k in resumed}
        if truncate and ctx.is_main:
            self._count_earlier_attempts(saved)
        if ctx.is_main:
            self.tracker = open_run_dir(cfg, d, self.start_step if truncate else None)
            lifecycle.announce(
                cfg,
                d,
                f"world_size={d.world_size} x micro_batch={d.micro_batch} x accum_steps="
                f"{d.accum_steps} = batch_size={cfg.batch_size}",
                tail=f"; resuming at step {self.start_step}" if self.start_step else "",
            )
            print(f"lbsgd: {optim.describe_groups(self.opt)}", flush=True)
        self.summary = {**new_summary(cfg, ctx, d, self.splits, self.start_step), **resumed}
        if ctx.is_main:
            rundir.write_summary(self.run_dir, self.summary)

    def _count_earlier_attempts(self, saved: dict[str, Any]) -> None:
        """The wall time and number of the run's earlier attempts: the larger of what the
        checkpoint saved (up to its step) and what the last attempt's summary.json says (up to its
        end, when it ended cleanly; a killed attempt wrote no time)."""
        try:
            last = rundir.read_summary(self.run_dir)
        except (OSError, ValueError):
            last = {}
        wall = last.get("total_wall_time_s", last.get("wall_time_s")) or 0.0
        attempts = last.get("attempts", 1 if "wall_time_s" in last else 0)
        self.earlier_wall_s = max(float(saved.get("total_wall_time_s", 0.0)), float(wall))
        self.earlier_attempts = max(int(saved.get("attempts", 1)), int(attempts))

    def _walls(self) -> dict[str, Any]:
        """This attempt's wall time so far, the total over every attempt, and their number."""
        wall = time.perf_counter() - self.t_start
        return {
            "wall_time_s": wall,
            "total_wall_time_s": self.earlier_wall_s + wall,
            "attempts": self.earlier_attempts + 1,
        }

    def finish(self, status: Status) -> None:
        """The run's status into summary.json and the tracker, which closes with its exit code;
        rank 0's last line says how the run ended (a failed run's: before its error propagates)."""
        walls = self._walls()  # a failed run's loop did not time itself: its wall time goes in
        lifecycle.conclude(
            self.summary, status, self.run_dir, self.tracker, walls, self.ctx.is_main
        )

    def ended_before_training(self, status: Status) -> None:
        """A run that failed (or was interrupted) before its loop: its summary's status when
        start() had written one, else rank 0's ending line saying that none was written."""
        if self.summary:
            self.finish(status)
        elif self.ctx.is_main:
            d = getattr(self, "d", None)  # build() derives it: absent when data building failed
            summary = {
                "status": status,
                "steps": self.start_step,
                "total_steps": d.total_steps if d else "?",
                "wall_time_s": time.perf_counter() - self.t_start,
            }
            print(ending_line(summary, self.run_dir, written=False), flush=True)

    # -- the loop ---------------------------------------------------------------------------------

    def loop(self) -> Status:
        """Optimizer steps from ``start_step``, each followed by its decisions; the status."""
        d = self.d
        stream = self._train_stream()
        bn_stats = ghost_bn.RunningStats(
            self.ghost,
            groups=self.d.bn_groups,
            all_reduce_sum=distributed.all_reduce_sum if self.ctx.world_size > 1 else None,
        )
        # tqdm's bar on a terminal, else plain lines (rank 0)
        progress = Progress(
            d.total_steps, self.start_step, self.sampler.epoch_of, self.ctx.is_main, self.t_start
        )
        pending: list[Pending] = []  # the steps awaiting a flush
        # the first SETTLING_STEPS steps (compilation, cuDNN autotuning, allocator growth) are
        # timed apart from the steady state: warmup_s vs img_per_s in summary.json
        settled_at = self.start_step + min(SETTLING_STEPS, d.total_steps - self.start_step - 1)
        clock = WindowClock()
        status = Status.COMPLETED
        self.model.train()
        for step in range(self.start_step, d.total_steps):
            pending.append(self.train_step(step, stream, bn_stats))
            progress.step()
            if step + 1 == settled_at:  # one device wait, once: where the settling steps end
                distributed.synchronize(self.ctx.device)
                clock.mark_settled()
            outcome = self.after_step(step + 1, pending, clock, progress)
            if outcome is not None:
                status = outcome
                break
        progress.close()
        self._note_time(clock, settled_at)
        if status == Status.DIVERGED and self.ctx.is_main:
            print(
                f"lbsgd: run diverged (non-finite loss) at step {self.summary['steps']}", flush=True
            )
        return status

    def _train_stream(self):
        """Every micro-batch this rank trains on from ``start_step``, in order."""
        cfg, ctx, sampler = self.cfg, self.ctx, self.sampler
        steps = range(self.start_step, self.d.total_steps)
        return data.batches(
            self.splits.train,
            (mb for t in steps for mb in sampler.rank_batches(t)),
            cfg.workers,
            pin=ctx.device.type == "cuda",
            seeds=(
                seeding.augmentation(cfg.seed, p) for t in steps for p in sampler.rank_positions(t)
            ),
            device=ctx.device,
        )

    def train_step(self, step: int, stream, bn_stats: ghost_bn.RunningStats) -> Pending:
        """Optimizer step ``step`` (0-based) over this rank's micro-batches from ``stream``; its
        pending record."""
        prec = self.precision
        lr = learning_rate(step, self.cfg, self.d)
        optim.set_lr(self.opt, lr)
        for f in self.features:
            f.before_step(step)
        loss_sum = self._accumulate(step, stream)
        scale = prec.loss_scale_tensor() if self.features else 1.0  # before the step unscales
        extra = [f.after_accumulate(scale) for f in self.features]
        prec.unscale(self.opt)  # fp16: the true gradients from here on
        late = [f.before_optimizer_step() for f in self.features]  # e.g. clipping
        extra = features.step_values(self.features, extra, late)
        prec.step(self.opt)  # skipped if fp16 gradients overflowed
        for f in self.features:  # before zero_grad
            f.after_optimizer_step()
        self.opt.zero_grad(set_to_none=True)
        bn_stats.commit()  # BN running statistics of the whole global batch
        extra = [t for t in extra if t is not None]
        return Pending(step + 1, lr, loss_sum / self.d.accum_steps, prec.loss_scale_tensor(), extra)

    def _accumulate(self, step: int, stream) -> torch.Tensor:
        """Forward/backward of step ``step``'s micro-batches, gradients accumulated (DDP's
        all-reduce on the last one, none in a local SGD block); the summed loss."""
        cfg, ctx, d, prec = self.cfg, self.ctx, self.d, self.precision
        fmt = memory_format(cfg)
        local = any(f.local_step(step) for f in self.features)
        # randomness inside the step (dropout) drawn from a generator seeded by the global
        # micro-batch: the same on any layout, and after a resume
        seeds = lifecycle.micro_batch_seeds(
            cfg, d, (step * ctx.world_size + ctx.rank) * d.accum_steps
        )
        loss_sum = torch.zeros((), device=ctx.device)
        for i in range(d.accum_steps):
            seeding.seed_generators(int(seeds[i]), ctx.device)
            for f in self.features:
                f.before_micro_batch(i)
            with distributed.no_sync(self.model, skip=local or i < d.accum_steps - 1):
                loss = lifecycle.micro_batch_loss(self.model, stream, ctx.device, fmt, prec)
                prec.backward(loss / d.accum_steps)
            synced = ctx.world_size > 1 and i == d.accum_steps - 1  # DDP all-reduced this one
            for f in self.features:
                f.after_backward(i, synced)
            loss_sum += loss.detach().float()
        return loss_sum

    def after_step(
        self, done: int, pending: list[Pending], clock: WindowClock, progress: Progress
    ) -> Status | None:
        """The decisions after ``done`` steps, carried out (a plain progress line after a flush,
        when one is due); the status if the run ends here."""
        in_sync = all(f.models_agree(done - 1) for f in self.features)
        plan = decide(self.cadence, done, len(pending), in_sync)
        if plan.flush:
            if not self._close_window(pending, clock, progress):
                self.summary["steps"] = done
                return Status.DIVERGED
            if self.stop_agreed:  # agreed at this flush: the step's decisions with it
                plan = decide(self.cadence, done, 0, in_sync, stop_agreed=True)
        with clock.set_aside():  # evaluation and checkpoints are not training time
            top1_error, reached = self._evaluate_as_planned(done, plan)
            if plan.checkpoint:
                self.save(done)
        if reached:
            return self._end_at_target(done, pending, clock, progress, plan, in_sync)
        self.summary["steps"] = done
        progress.report(done, plan.boundary, top1_error)
        if not plan.stop:
            return None
        if self.ctx.is_main:  # asked to stop: rank 0's line, "interrupted"
            where = "checkpoint written" if plan.checkpoint else "no checkpoint written here"
            print(
                f"lbsgd: asked to stop ({self.stop.caught or 'another process'}): "
                f"stopped after step {done}, {where}; resume=true continues",
                flush=True,
            )
        return Status.INTERRUPTED

    def _close_window(self, pending: list[Pending], clock: WindowClock, progress: Progress) -> bool:
        """Flush the pending steps as one clock window; False if a loss was not finite."""
        # the device's queued work belongs to this window: wait for it before the clock
        distributed.synchronize(self.ctx.device)
        img_per_s = clock.close_window(self.cfg.batch_size * len(pending))
        finite = self._flush(pending, img_per_s, progress)
        pending.clear()
        return finite

    def _note_time(self, clock: WindowClock, settled_at: int) -> None:
        """Epochs, wall and training time, steady throughput (the settling steps left out) into
        the summary."""
        b, steps = self.cfg.batch_size, self.summary["steps"]
        train_time = clock.train_s  # every step so far: the last flush has all
        steps_run = steps - self.start_step
        settling = settled_at - self.start_step if steps >= settled_at else 0
        steady_s = train_time - (clock.settle_s if settling else 0.0)
        steady_steps = steps_run - settling
        self.summary.update(
            epochs=self.sampler.epoch_of(steps),
            **self._walls(),
            train_time_s=train_time,
            # steady training throughput: the settling steps left out (all steps when the
            # run is too short to have a steady part)
            img_per_s=(
                steady_steps * b / steady_s
                if steady_steps > 0 and steady_s > 0
                else steps_run * b / train_time
                if train_time > 0
                else None
            ),
            warmup_steps_timed=settling,
            warmup_s=clock.settle_s if settling else None,
        )

    def _flush(self, pending: list[Pending], img_per_s: float, progress: Progress) -> bool:
        """Average the pending losses over ranks and log them; False if any is not finite. The
        same collective tells every rank whether any was asked to stop (``stop_agreed``)."""
        asked = torch.tensor(float(self.stop.caught is not None), device=pending[0].loss.device)
        # the flush's one device read
        reduced = unpack_flush(
            distributed.all_reduce_mean(pack_flush(pending, asked)).cpu().tolist(), len(pending)
        )
        self.stop_agreed = reduced.stop_asked
        records = features.flush_records(self.features, reduced.extra, len(pending), self.summary)
        if self.tracker is not None:
            self._log_train(pending, reduced, records, img_per_s)
        losses = reduced.losses
        self.summary.setdefault("final", {})["train_loss"] = losses[-1]
        self.summary["skipped_steps"] = self.precision.skipped_steps
        progress.flushed(Flushed(pending[-1].step, losses[-1], pending[-1].lr, img_per_s))
        return all(math.isfinite(v) for v in losses)

    def _log_train(self, pending: list[Pending], reduced: Reduced, records, img_per_s) -> None:
        """Every step's train record in metrics.jsonl; W&B: one point per flush, the window's mean
        loss (its other values: the last step's)."""
        losses = reduced.losses
        for p, loss, scale, g in zip(pending, losses, reduced.scales, records, strict=True):
            rec = {
                "kind": "train",
                "step": p.step,
                "epoch": self.sampler.epoch_of(p.step),
                "lr": p.lr,
                "loss": loss,
                "img_per_s": img_per_s,
                "loss_scale": scale,
                **g,
            }
            self.tracker.log(rec, wandb=False)
        self.tracker.log_wandb({**rec, "loss": sum(losses) / len(losses)})

    def _evaluate_as_planned(self, done: int, plan) -> tuple[float | None, bool]:
        """The step's evaluation as planned: its test top-1 error (None without a full
        evaluation) and whether it reached ``stop_at_error`` before the last step (then also the
        test split, where the planned evaluation was a probe of the held-out split alone)."""
        if plan.boundary:
            for f in self.features:
                f.at_boundary()
        rec: dict[str, Any] = {}
        if plan.evaluate or plan.probe:
            rec = self.evaluate(done) if plan.evaluate else self.evaluate(done, self.held_out)
        reached = target_reached(self.cfg.stop_at_error, rec) and done < self.d.total_steps
        if reached and not plan.evaluate and self.held_out == "val":
            rec = {**rec, **self.evaluate(done, only="test")}  # the run ends here
        return rec.get("top1_error_pct"), reached

    def _end_at_target(self, done, pending, clock, progress, plan, in_sync) -> Status:
        """A run that reached ``stop_at_error`` at step ``done``: its steps flushed, a checkpoint
        (where the processes' models agree), "completed"."""
        if pending and not self._close_window(pending, clock, progress):
            self.summary["steps"] = done
            return Status.DIVERGED
        if self.cfg.checkpoint and in_sync and not plan.checkpoint:
            with clock.set_aside():
                self.save(done)
        self.summary["steps"] = self.summary["stopped_at_target"] = done
        progress.report(done, True, self.summary["final"].get("top1_error_pct"))
        if self.ctx.is_main:
            print(
                f"lbsgd: held-out top-1 error at or below stop_at_error="
                f"{self.cfg.stop_at_error:g}% after step {done}: the run ends here",
                flush=True,
            )
        return Status.COMPLETED

    @property
    def held_out(self) -> str:
        """The split a probe (``eval_per_octave``) measures: the held-out one, else the test split."""
        return "val" if self.splits.val is not None else "test"

    def evaluate(self, step: int, only: str | None = None) -> dict[str, Any]:
        """Top-1/top-5 error (%) and loss on the test split (and the held-out split, with
        ``holdout``; ``only``: that split alone), each rank a disjoint shard of each, the sums
        added in one all-reduce; the evaluation's record."""
        # Ghost BN keeps BN buffers equal on every rank; this also covers a user model's own
        # normalisation layers, which lbsgd does not convert.
        distributed.sync_buffers(self.net)
        return lifecycle.evaluate(
            self.eval_model, self.built, self.cfg, self.ctx, step, only, self.tracker, self.summary
        )

    # -- checkpoints ------------------------------------------------------------------------------

    def save(self, step: int) -> None:
        """Everything step ``step`` depends on (lbsgd.checkpoint). Every rank sends its RNG states
        and what only it holds (the features' ``rank_keys``: its momentum under local SGD, its
        PowerSGD memories); the features' ``checkpoint_keys`` are the same on every rank."""
        mine, shared = features.checkpoint_entries(self.features)
        mine = {**checkpoint.rng_state(self.ctx.device), **mine}
        ranks = distributed.all_gather_object(mine)
        if not self.ctx.is_main:
            return
        checkpoint.save(
            self.run_dir,
            {
                **lifecycle.checkpoint_core(
                    self.net, self.opt, step, self.d, self.ctx.world_size, self.cfg
                ),
                "precision": self.precision.state_dict(),
                "sampler": self.sampler.position(step),
                "ranks": ranks,
                "summary": {
                    **{k: self.summary[k] for k in ("best", "final") if k in self.summary},
                    **{k: v for k, v in self._walls().items() if k != "wall_time_s"},
                },
                **shared,
            },
        )

    def _throwaway_backward(self) -> None:
        """One training forward/backward on the first micro-batch that leaves no trace
        (:func:`lbsgd.network.backward_without_trace`). Training mode, because the order in which
        the backward pass produces gradients is what DDP's buckets follow."""
        device = self.ctx.device
        x, y = next(
            data.batches(self.splits.train, [torch.arange(self.d.micro_batch)], device=device)
        )
        x = x.to(device, memory_format=memory_format(self.cfg))
        backward_without_trace(
            self.model, self.net, lambda: (x, y.to(device)), self.precision, device
        )
