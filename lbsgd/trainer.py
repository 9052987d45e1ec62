"""The training loop: composes config, data, model, optimizer, schedule and tracking; holds no policy.

One loop serves one process and ``torchrun`` with N processes alike. Per optimizer step each process
runs ``accum_steps`` micro-batches of ``micro_batch`` samples; gradients are averaged over the global
batch kn by scaling each micro-batch loss by 1/accum_steps and letting DDP average over the
processes on the last micro-batch (``no_sync`` on the others, so one all-reduce per step).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from lbsgd import checkpoint, comm, data, distributed, isa, models, noise_scale, optim
from lbsgd.config import (
    Config,
    ConfigError,
    check_world,
    derive,
    dump,
    import_plugins,
    micro_batch_candidates,
    read_yaml,
)
from lbsgd.environment import environment
from lbsgd.models import ghost_bn
from lbsgd.precision import Precision
from lbsgd.schedules import learning_rate
from lbsgd.staleness import StaleWeights
from lbsgd.tracking import Tracker

# Optimizer steps timed apart as warm-up (compilation, autotuning) at the start of each process run
TIMED_WARMUP_STEPS = 3
STATUS_EXIT_CODE = {"completed": 0, "diverged": 3, "interrupted": 143}
# Asked to stop (a scheduler's pre-emption or time limit: SLURM sends SIGTERM, or the signal of
# --signal=USR1@90; torchrun's agent passes its own SIGTERM on to the workers): the processes agree
# on a step at the next metric flush, write a checkpoint there and exit with "interrupted".
# SIGINT (Ctrl-C on `lbsgd train`, at the terminal on torchrun and its workers) stops the same way:
# status "interrupted", exit code 143, whichever signal asked.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def check(cfg: Config, world_size: int | None = None, local_world_size: int | None = None) -> None:
    """Rules that need the registries, the data directory or the process layout (torchrun's
    environment by default); with the config's own checks, all before any work starts. The
    config's plugins are imported first (a Config built in Python names them, as a file does)."""
    import_plugins(cfg.plugins)
    data.check(cfg)
    if cfg.model not in models.MODELS:
        raise ConfigError(models.MODELS.unknown_message(cfg.model))
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if cfg.async_ps and world_size < 2:
        raise ConfigError(
            f"async_ps=true needs torchrun with at least 2 processes (rank 0 the server, the "
            f"others workers), not world_size={world_size}"
        )
    check_world(cfg, world_size, local_world_size)
    distributed.check_layout(cfg.device, cfg.backend, local_world_size or world_size)


def train(cfg: Config) -> dict[str, Any]:
    """Train one run to the end (or until it diverges); returns its summary.json content (a
    parameter server's worker: its own)."""
    run = _Run
    if cfg.async_ps:  # rank 0 a parameter server, the others asynchronous workers
        from lbsgd import parameter_server  # built on this module: imported when used

        run = parameter_server.Run
    check(cfg)
    isa.require(cfg.cpu_isa)  # before the run's first CPU operation: refused if it cannot hold
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    if cfg.deterministic:
        deterministic()
    ctx = distributed.init(cfg.device, backend=cfg.backend)
    try:
        return run(cfg, ctx).run()
    finally:
        distributed.shutdown()
        # a train() called from Python (a notebook) leaves the process as it found it
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[1:]


def deterministic() -> None:
    """Deterministic kernels from here on (before CUDA starts): cuBLAS needs a fixed workspace
    (its documented setting for reproducibility), cuDNN no benchmarking and no nondeterministic
    algorithms; an operation with no deterministic implementation raises instead of varying."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


# micro_batch=auto on a CPU: no memory probe (running out of host memory kills the process rather
# than raising), the largest candidate up to this many samples
CPU_AUTO_MICRO_BATCH = 256
# micro_batch=auto on a GPU: a candidate fits when its probe's peak memory stays under this share
# of the device's memory (the rest: optimizer state, DDP buckets, prefetched batches, fragmentation)
GPU_MEMORY_SHARE = 0.85


def pick_micro_batch(
    cfg: Config, ctx: distributed.Context, net: torch.nn.Module, splits, precision: Precision
) -> int:
    """``micro_batch=auto``: the largest multiple of bn_batch dividing the per-process share that
    fits the device. On CUDA each candidate, largest first, is probed with one training forward and
    backward on random inputs of the dataset's shape, leaving no trace (buffers, RNG, gradients
    restored); every process takes the smallest choice of all (the layout needs one micro-batch)."""
    candidates = micro_batch_candidates(cfg, ctx.world_size)
    if ctx.device.type != "cuda":
        choice = next((m for m in candidates if m <= CPU_AUTO_MICRO_BATCH), candidates[-1])
    else:
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        choice = 0
        for m in candidates:
            if _probe(net, m, splits, cfg, ctx.device, precision) <= GPU_MEMORY_SHARE * total:
                choice = m
                break
        if not choice:
            raise ConfigError(
                f"micro_batch=auto: not even micro_batch={candidates[-1]} (one BN group of "
                f"bn_batch={cfg.bn_batch}) fits in the memory of {ctx.device}"
            )
    choice = -int(distributed.all_reduce_max(torch.tensor([-choice], device=ctx.device)).item())
    if ctx.is_main:
        print(f"lbsgd: micro_batch=auto -> {choice} (candidates {candidates})", flush=True)
    return choice


def _probe(net, m: int, splits, cfg: Config, device: torch.device, precision: Precision) -> float:
    """Peak device memory (bytes) of one training forward/backward of ``m`` samples; inf when it
    does not fit."""
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    size = splits.image_size
    buffers = [b.detach().clone() for b in net.buffers()]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with torch.random.fork_rng(devices=[device]):
            x = torch.randn(m, 3, size, size, device=device).contiguous(memory_format=fmt)
            y = torch.randint(0, splits.num_classes, (m,), device=device)
            with precision.autocast():
                loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            del x, y, loss
        peak = float(torch.cuda.max_memory_allocated(device))
    except torch.cuda.OutOfMemoryError:
        peak = math.inf
    finally:
        net.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_(list(net.buffers()), buffers)
        torch.cuda.empty_cache()
    return peak


def _on_main(ctx: distributed.Context, fn, then_all: bool = False):
    """Run ``fn`` on rank 0 and give every rank its result, or raise its error on every rank.

    With ``then_all`` the other ranks run ``fn`` themselves once rank 0 has succeeded (rank 0 fills
    a cache first, the others read it).
    """
    result, error = None, None
    if ctx.is_main:
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - re-raised below, after telling the other ranks
            error = e
    message = distributed.broadcast_object(None if error is None else str(error))
    if error is not None:
        raise error
    if message is not None:
        raise ConfigError(message)
    if then_all:
        return result if ctx.is_main else fn()
    return distributed.broadcast_object(result)


def check_run_dir(cfg: Config) -> str:
    """'new', 'resume' or 'completed'; a directory holding another run is never overwritten.

    Reads only: a refusal is a one-line ConfigError and leaves every file as it was."""
    run_dir = cfg.run_dir()
    if (run_dir / "config.yaml").exists():
        status = _read_status(run_dir)
        if not cfg.resume:
            raise ConfigError(
                f"run directory {str(run_dir)!r} already holds a run (status={status}); pass "
                "resume=true to continue it, or choose another name= or out_dir="
            )
        _same_experiment(cfg, read_yaml(run_dir / "config.yaml"), str(run_dir))
        return "completed" if status == "completed" else "resume"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"run directory {str(run_dir)!r} exists and is not empty; choose another name="
        )
    return "new"


def _same_experiment(cfg: Config, old: dict[str, Any], where: str) -> None:
    """Refuse to continue ``old`` (a saved config) with other experiment keys, naming each."""
    new = cfg.keys_of("experiment")
    differ = [k for k in new if k in old and _plain(old[k]) != _plain(new[k])]
    if differ:
        shown = ", ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in differ)
        raise ConfigError(f"resume=true but experiment keys differ from {where}: {shown}")


def _finite(v: Any) -> Any:
    """Strict JSON: non-finite floats (a diverged loss) become the strings "nan" / "inf"."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """``run_dir/summary.json``, replaced atomically (strict JSON: non-finite floats as strings)."""
    path = run_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(summary), indent=2, default=str) + "\n")
    tmp.replace(path)


@torch.no_grad()
def evaluation_sums(
    net: torch.nn.Module,
    splits: data.Splits,
    idx: torch.Tensor,
    batch: int,
    cfg: Config,
    device: torch.device,
    precision: Precision,
) -> torch.Tensor:
    """[summed loss, top-1 hits, top-5 hits, count] (float64, on ``device``) of ``net`` in eval
    mode over the test samples ``idx``, in batches of ``batch``; the net is left in train mode."""
    net.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    k = min(5, splits.num_classes)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    for x, y in data.batches(splits.test, idx.split(batch), cfg.workers, device=device):
        x, y = x.to(device, memory_format=fmt), y.to(device)
        with precision.autocast():
            out = net(x).float()
        topk = out.topk(k, dim=1).indices
        sums[0] += torch.nn.functional.cross_entropy(out, y, reduction="sum")
        sums[1] += (topk[:, 0] == y).sum()
        sums[2] += (topk == y[:, None]).any(dim=1).sum()
        sums[3] += len(y)
    net.train()
    return sums


def evaluation_record(step: int, sums: torch.Tensor, batch_size: int, num_train: int) -> dict:
    """The metrics.jsonl record of an evaluation from :func:`evaluation_sums` (summed over the
    processes that shared the test split)."""
    loss, top1, top5, count = sums.cpu().tolist()
    return {
        "kind": "eval",
        "step": step,
        "epoch": step * batch_size / num_train,
        "top1_error_pct": 100.0 * (1 - top1 / count),
        "top5_error_pct": 100.0 * (1 - top5 / count),
        "test_loss": loss / count,
    }


def note_evaluation(summary: dict[str, Any], rec: dict[str, Any]) -> None:
    """An evaluation into summary.json's ``final``, and ``best`` when its top-1 error is lower."""
    summary.setdefault("final", {}).update(
        {k: rec[k] for k in ("top1_error_pct", "top5_error_pct", "test_loss")}
    )
    if rec["top1_error_pct"] < summary.get("best", {}).get("top1_error_pct", math.inf):
        summary["best"] = {"top1_error_pct": rec["top1_error_pct"], "step": rec["step"]}


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _read_status(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status", "unknown")
    except (OSError, ValueError, AttributeError):
        return "unknown"


class _Run:
    def __init__(self, cfg: Config, ctx: distributed.Context) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.summary_resumed: dict[str, Any] = {}  # best/final evaluations before the checkpoint

    # -- setup ------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        t_start = time.perf_counter()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        mode = _on_main(ctx, lambda: check_run_dir(cfg))
        self.run_dir = cfg.run_dir()
        if mode == "completed":
            print(f"lbsgd: {self.run_dir} is already complete; nothing to do", flush=True)
            return json.loads((self.run_dir / "summary.json").read_text())
        splits = _on_main(ctx, lambda: data.build(cfg), then_all=True)  # rank 0 fills caches
        torch.manual_seed(
            cfg.seed
        )  # the same initialisation on every rank and for every batch size
        net = models.build(cfg, splits.num_classes, splits.image_size)
        self.ghost = ghost_bn.ghost_modules(ghost_bn.convert(net, cfg.bn_batch))
        net.to(ctx.device)
        if cfg.channels_last:
            net.to(memory_format=torch.channels_last)
        self.precision = Precision(cfg.precision, ctx.device, cfg.loss_scale)
        micro = None
        if cfg.micro_batch == "auto":
            micro = pick_micro_batch(cfg, ctx, net, splits, self.precision)
        d = derive(cfg, ctx.world_size, len(splits.train), micro)
        opt = optim.build(cfg, net)
        self.sampler = data.StepSampler(
            len(splits.train),
            cfg.batch_size,
            d.micro_batch,
            ctx.rank,
            ctx.world_size,
            cfg.seed,
            d.total_steps,
        )
        start_step = 0
        state = self._load_checkpoint() if mode == "resume" else None
        if state is not None:
            start_step = self._restore(state, net, opt)
        self.noise = None  # noise_scale=true: the gradient noise scale's probe
        if d.noise_batch:
            self.noise = noise_scale.Probe(
                list(net.parameters()),
                d.noise_batch // d.micro_batch,
                d.accum_steps,
                d.noise_batch,
                cfg.batch_size,
                cfg.noise_scale_ema,
            )
            if state is not None and "noise_scale" in state:
                self.noise.smoother.load_state_dict(state["noise_scale"])
        # -- staleness > 0: simulated asynchronous SGD, the ring of past weights (lbsgd.staleness)
        self.stale = None
        if cfg.staleness:
            self.stale = StaleWeights(
                list(net.parameters()), cfg.staleness, cfg.staleness_dist, cfg.seed
            )
            if state is not None:
                self.stale.load_state_dict(state.get("staleness"), state.get("file", "checkpoint"))
        # --
        if cfg.compile:
            net = torch.compile(net)
        self.net, self.opt, self.splits, self.d = net, opt, splits, d
        self.model = distributed.wrap(
            net,
            ctx,
            cfg.bucket_cap_mb,
            cfg.comm_hook,
            cfg.powersgd_rank,
            d.warmup_steps,
            self.noise,
        )
        self.comm_state = getattr(self.model, "comm_state", None)
        if self.comm_state is not None and state is not None:
            mine = self._rank_state(state)
            if mine is not None and "powersgd" in mine:  # this process's memories, exactly
                comm.rebuild_buckets(self.model, self.comm_state, self._throwaway_backward)
                self.comm_state.load_memories(mine["powersgd"])
            else:  # another number of processes, or no PowerSGD then: fresh error feedback
                self.comm_state.iter = start_step  # (compression stays on past the warmup)
                if ctx.is_main:
                    print(
                        "lbsgd: comm_hook=powersgd resumes with fresh error feedback (the "
                        "checkpoint holds no PowerSGD state for this process)",
                        flush=True,
                    )
        self.local_sgd = None
        if cfg.local_sgd and ctx.world_size > 1:  # post-local SGD starts after the warmup
            self.local_sgd = comm.LocalSGD(cfg.local_sgd, start=d.warmup_steps, step=start_step)
        # -- BMUF: block momentum / block lr off their defaults filter local SGD's blocks (at
        # them BMUF is the plain averaging above); on one process too (K = 1) (lbsgd.comm.BMUF)
        if cfg.local_sgd and comm.BMUF.filters(cfg.block_momentum, cfg.block_lr):
            self.local_sgd = comm.BMUF(
                cfg.local_sgd,
                d.warmup_steps,
                start_step,
                self.net.parameters(),
                cfg.block_momentum,
                cfg.block_lr,
                cfg.block_nesterov,
            )
            if state is not None and state.get("bmuf") is not None:
                self.local_sgd.load_state_dict(state["bmuf"])
            elif start_step > d.warmup_steps and ctx.is_main:
                print(
                    "lbsgd: BMUF resumes with Delta = 0 from the checkpoint's model (the "
                    "checkpoint holds no BMUF state)",
                    flush=True,
                )
            if ctx.is_main:
                start = "W + eta_B Delta (Nesterov)" if cfg.block_nesterov else "W (classical)"
                print(
                    f"lbsgd: BMUF eta_B={cfg.block_momentum:g} eps_B={cfg.block_lr:g}: blocks of "
                    f"{cfg.local_sgd} local steps on {ctx.world_size} processes after step "
                    f"{d.warmup_steps}, each from {start}",
                    flush=True,
                )
        # --

        full_config = {**cfg.to_dict(), **d.to_dict()}
        self.tracker = None
        if ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(dump(cfg, d))
            self.tracker = Tracker(
                self.run_dir,
                full_config,
                mode=cfg.wandb,
                project=cfg.wandb_project,
                group=cfg.study,
                name=cfg.run_name(),
                truncate_after_step=start_step if mode == "resume" else None,
            )
            self._announce(d, start_step)
            print(f"lbsgd: {optim.describe_groups(opt)}", flush=True)
        self.summary: dict[str, Any] = {
            "status": "running",
            "run": cfg.run_name(),
            "study": cfg.study,
            "experiment_id": cfg.experiment_id(),
            "steps": start_step,
            "total_steps": d.total_steps,
            "environment": {
                **environment(
                    ctx.device,
                    ctx.world_size,
                    cpu_isa=cfg.cpu_isa,
                    train_split=splits.train if ctx.is_main else None,  # its digest: rank 0's
                ),
                "backend": distributed.backend_name(ctx.device, cfg.backend),
                "deterministic": torch.are_deterministic_algorithms_enabled(),
            },
            **self.summary_resumed,
        }
        self._write_summary()
        status = "failed"
        handlers = self._catch_stop_signals()
        try:
            status = self._loop(start_step, t_start)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self.summary["status"] = status
            self._write_summary()
            if self.tracker is not None:
                self.tracker.summary(self.summary)
                self.tracker.close(exit_code=STATUS_EXIT_CODE.get(status, 1))
        return self.summary

    def _catch_stop_signals(self) -> dict:
        """Record STOP_SIGNALS instead of dying of them; returns the handlers they replace."""
        self.stop_signal: str | None = None  # set by the handler, acted on at the next flush
        self.stop_agreed = False

        def record(signum, frame):
            self.stop_signal = signal.Signals(signum).name

        handlers = {}
        try:
            for sig in STOP_SIGNALS:
                handlers[sig] = signal.signal(sig, record)
        except ValueError:  # not the main thread: leave signals to whoever owns it
            pass
        return handlers

    def _announce(self, d, start_step: int) -> None:
        cfg = self.cfg
        print(
            f"lbsgd: run {self.run_dir} | {cfg.model} on {cfg.dataset}, "
            f"world_size={d.world_size} x micro_batch={d.micro_batch} x accum_steps={d.accum_steps}"
            f" = batch_size={cfg.batch_size}\n"
            f"lbsgd: lr {cfg.base_lr} x {cfg.lr_scaling}({cfg.batch_size}/{cfg.reference_batch}) = "
            f"{d.lr:.6g}; warmup={cfg.warmup} from {d.warmup_start_lr:.6g} over {d.warmup_steps} steps;"
            f" schedule={cfg.schedule}; {d.total_steps} steps = {cfg.epochs:g} epochs x "
            f"{d.steps_per_epoch:.4g} steps/epoch (N={d.num_train})"
            + (f"; resuming at step {start_step}" if start_step else ""),
            flush=True,
        )

    def _write_summary(self) -> None:
        if self.ctx.is_main:
            write_summary(self.run_dir, self.summary)

    # -- the loop ---------------------------------------------------------------------------------

    def _loop(self, start_step: int, t_start: float) -> str:
        cfg, ctx, d = self.cfg, self.ctx, self.d
        b, n = cfg.batch_size, d.num_train
        sampler = self.sampler
        steps = range(start_step, d.total_steps)
        stream = data.batches(
            self.splits.train,
            (mb for t in steps for mb in sampler.rank_batches(t)),
            cfg.workers,
            pin=ctx.device.type == "cuda",
            seeds=(
                data.sample_seeds(2 * cfg.seed, p) for t in steps for p in sampler.rank_positions(t)
            ),
            device=ctx.device,
        )
        criterion = torch.nn.CrossEntropyLoss()
        prec = self.precision
        bn_stats = ghost_bn.RunningStats(
            self.ghost,
            groups=b // cfg.bn_batch,
            all_reduce_sum=distributed.all_reduce_sum if ctx.world_size > 1 else None,
        )
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        bar = tqdm(
            total=d.total_steps,
            initial=start_step,
            unit="step",
            dynamic_ncols=True,
            disable=not (ctx.is_main and sys.stderr.isatty()),
        )
        # (step, lr, loss tensor, loss scale, noise-scale norms or None) awaiting a flush
        pending: list[tuple] = []
        noise = self.noise
        t_other = 0.0  # seconds spent in evaluation and checkpoints (not training throughput)
        # the first TIMED_WARMUP_STEPS steps (compilation, cuDNN autotuning, allocator growth) are
        # timed apart from the steady state: warmup_s vs img_per_s in summary.json
        warm_until = start_step + min(TIMED_WARMUP_STEPS, d.total_steps - start_step - 1)
        t_warm = train_time = 0.0
        t_loop = t_window = time.perf_counter()
        status = "completed"
        self.model.train()
        for step in range(start_step, d.total_steps):
            lr = learning_rate(step, cfg, d)
            optim.set_lr(self.opt, lr)
            loss_sum = torch.zeros((), device=ctx.device)
            local = self.local_sgd is not None and self.local_sgd.local(step)
            # randomness inside the step (dropout) drawn from a generator seeded by the global
            # micro-batch: the same on any layout, and after a resume
            first = (step * ctx.world_size + ctx.rank) * d.accum_steps
            seeds = data.sample_seeds(2 * cfg.seed + 1, torch.arange(first, first + d.accum_steps))
            if self.stale is not None:  # staleness: W_t enters the ring of past weights
                self.stale.begin(step)
            if noise is not None:
                noise.start()
            for i in range(d.accum_steps):
                _seed(int(seeds[i]), ctx.device)
                if self.stale is not None:  # staleness: this forward/backward runs on W_{t-tau}
                    self.stale.use(ctx.rank * d.accum_steps + i)  # the global micro-batch index
                x, y = next(stream)
                x = x.to(ctx.device, non_blocking=True, memory_format=fmt)
                y = y.to(ctx.device, non_blocking=True)
                with distributed.no_sync(self.model, skip=local or i < d.accum_steps - 1):
                    with prec.autocast():
                        loss = criterion(self.model(x), y)
                    prec.backward(loss / d.accum_steps)
                if noise is not None:  # DDP all-reduces the last backward of a step
                    noise.after_backward(i, synced=ctx.world_size > 1 and i == d.accum_steps - 1)
                loss_sum += loss.detach().float()
            norms = None if noise is None else noise.finish(prec.loss_scale_tensor())
            if self.stale is not None:  # staleness: the optimizer steps W_t (stale gradient)
                self.stale.restore()
            prec.step(self.opt)  # unscaled gradients; skipped if fp16 gradients overflowed
            if (
                self.local_sgd is not None
            ):  # before zero_grad: torch's averager skips grad-less ones
                self.local_sgd.after_step(list(self.net.parameters()))
            self.opt.zero_grad(set_to_none=True)
            bn_stats.commit()  # BN running statistics of the whole global batch
            pending.append(
                (step + 1, lr, loss_sum / d.accum_steps, prec.loss_scale_tensor(), norms)
            )
            done = step + 1
            bar.update(1)
            if step + 1 == warm_until:  # one device wait, once: where the warm-up ends
                distributed.synchronize(ctx.device)
                t_warm = time.perf_counter() - t_loop - t_other
            epoch_end = done * b // n > step * b // n
            last = done == d.total_steps
            save_due = (
                not (epoch_end or last)
                and cfg.checkpoint
                and cfg.checkpoint_every
                and done % cfg.checkpoint_every == 0
                and (self.local_sgd is None or self.local_sgd.in_sync(step))
            )
            # every step up to a checkpoint is logged before it is written: a resumed run's
            # metrics.jsonl then misses none (and the noise scale's averages are in the checkpoint)
            if len(pending) >= cfg.log_every or epoch_end or last or save_due:
                # the device's queued work belongs to this window: wait for it before the clock
                distributed.synchronize(ctx.device)
                now = time.perf_counter()
                train_time = now - t_loop - t_other  # every step so far: the last flush has all
                finite = self._flush(pending, b * len(pending) / max(now - t_window, 1e-9), bar)
                pending, t_window = [], now  # windows tile the training time: the flush's own
                # host time is counted in the next window
                if not finite:
                    status = "diverged"
                    self.summary["steps"] = done
                    break
            saved = False
            if epoch_end or last:
                t0 = time.perf_counter()
                if self.local_sgd is not None:
                    self.local_sgd.sync(list(self.net.parameters()))
                epoch = done * b // n
                if last or (cfg.eval_every and epoch % cfg.eval_every == 0):
                    self._evaluate(done)
                if cfg.checkpoint:
                    self._save(done)
                    saved = True
                t_other += time.perf_counter() - t0
                t_window += time.perf_counter() - t0
            elif save_due:
                t0 = time.perf_counter()
                self._save(done)
                saved = True
                t_other += time.perf_counter() - t0
                t_window += time.perf_counter() - t0
            self.summary["steps"] = done
            if self.stop_agreed and not last:
                status = "interrupted"
                exact = self.local_sgd is None or self.local_sgd.in_sync(step)
                if cfg.checkpoint and not saved and exact:
                    self._save(done)
                    saved = True
                if ctx.is_main:
                    where = "checkpoint written" if saved else "no checkpoint written here"
                    print(
                        f"lbsgd: asked to stop ({self.stop_signal or 'another process'}): "
                        f"stopped after step {done}, {where}; resume=true continues",
                        flush=True,
                    )
                break
        bar.close()
        steps_run = self.summary["steps"] - start_step
        warm_steps = warm_until - start_step if self.summary["steps"] >= warm_until else 0
        steady_s = train_time - (t_warm if warm_steps else 0.0)
        steady_steps = steps_run - warm_steps
        self.summary.update(
            epochs=self.summary["steps"] * b / n,
            wall_time_s=time.perf_counter() - t_start,
            train_time_s=train_time,
            # steady training throughput: the timed warm-up steps left out (all steps when the
            # run is too short to have a steady part)
            img_per_s=(
                steady_steps * b / steady_s
                if steady_steps > 0 and steady_s > 0
                else steps_run * b / train_time
                if train_time > 0
                else None
            ),
            warmup_steps_timed=warm_steps,
            warmup_s=t_warm if warm_steps else None,
        )
        if status == "diverged" and ctx.is_main:
            print(
                f"lbsgd: run diverged (non-finite loss) at step {self.summary['steps']}", flush=True
            )
        return status

    def _flush(self, pending, img_per_s: float, bar) -> bool:
        """Average the pending losses over ranks and log them; False if any is not finite. The
        same collective tells every rank whether any was asked to stop (``stop_agreed``)."""
        device = pending[0][2].device
        asked = torch.tensor(float(self.stop_signal is not None), device=device)
        scales = [torch.as_tensor(p[3], dtype=torch.float32, device=device) for p in pending]
        values = torch.stack([*(p[2] for p in pending), *scales, asked])
        k = len(pending)
        if self.noise is not None:  # each process's mean |G_small|^2 (and |G_big|^2) join in
            values = torch.cat([values.double(), *(p[4] for p in pending)])
        reduced = distributed.all_reduce_mean(values).cpu().tolist()  # the flush's one device read
        losses, scales = reduced[:k], reduced[k : 2 * k]
        self.stop_agreed = reduced[2 * k] > 0
        gns = [{}] * k
        if self.noise is not None:
            gns = [
                self.noise.record(*reduced[2 * k + 1 + 2 * j : 2 * k + 3 + 2 * j]) for j in range(k)
            ]
            g_sq, trace, b_simple = self.noise.smoother.value()
            self.summary["noise_scale"] = {
                "b_simple": b_simple,
                "g_sq": g_sq,
                "trace": trace,
                "b_small": self.noise.b_small,
                "b_big": self.noise.b_big,
            }
        b, n = self.cfg.batch_size, self.d.num_train
        if self.tracker is not None:
            for (step, lr, *_), loss, scale, g in zip(pending, losses, scales, gns, strict=True):
                rec = {
                    "kind": "train",
                    "step": step,
                    "epoch": step * b / n,
                    "lr": lr,
                    "loss": loss,
                    "img_per_s": img_per_s,
                    "loss_scale": scale,
                    **g,
                }
                self.tracker.log(rec, wandb=False)  # every step in metrics.jsonl
            # W&B: one point per flush, the window's mean loss (its other values: the last step's)
            self.tracker.log_wandb({**rec, "loss": sum(losses) / len(losses)})
        self.summary.setdefault("final", {})["train_loss"] = losses[-1]
        self.summary["skipped_steps"] = self.precision.skipped_steps
        bar.set_postfix(
            loss=f"{losses[-1]:.4f}", lr=f"{pending[-1][1]:.4g}", img_s=f"{img_per_s:.0f}"
        )
        return all(math.isfinite(v) for v in losses)

    def _evaluate(self, step: int) -> None:
        """Top-1/top-5 error (%) and loss on the test split, each rank a disjoint shard."""
        ctx, test = self.ctx, self.splits.test
        # Ghost BN keeps BN buffers equal on every rank; this also covers a user model's own
        # normalisation layers, which lbsgd does not convert.
        distributed.sync_buffers(distributed.unwrap(self.net))
        idx = torch.tensor(data.shard(len(test), ctx.rank, ctx.world_size), dtype=torch.long)
        sums = evaluation_sums(
            self.net, self.splits, idx, 4 * self.d.micro_batch, self.cfg, ctx.device, self.precision
        )
        rec = evaluation_record(
            step, distributed.all_reduce_sum(sums), self.cfg.batch_size, self.d.num_train
        )
        if self.tracker is not None:
            self.tracker.log(rec)
        note_evaluation(self.summary, rec)

    # -- checkpoints ------------------------------------------------------------------------------

    def _save(self, step: int) -> None:
        """Everything step ``step`` depends on (lbsgd.checkpoint). Every rank sends its RNG states
        and what only it holds: its momentum under local SGD, its PowerSGD memories."""
        mine: dict[str, Any] = _rng_state(self.ctx.device)
        if self.local_sgd is not None:
            mine["optimizer"] = self.opt.state_dict()
        if self.comm_state is not None:
            mine["powersgd"] = self.comm_state.memories()
        extra = {} if self.noise is None else {"noise_scale": self.noise.smoother.state_dict()}
        if self.stale is not None:  # staleness: the ring of past weights, the same on every rank
            extra["staleness"] = self.stale.state_dict()
        if isinstance(self.local_sgd, comm.BMUF):  # BMUF: W and Δ, the same on every rank
            extra["bmuf"] = self.local_sgd.state_dict()
        ranks = distributed.all_gather_object(mine)
        if not self.ctx.is_main:
            return
        checkpoint.save(
            self.run_dir,
            {
                "model": distributed.unwrap(self.net).state_dict(),
                "optimizer": self.opt.state_dict(),
                "precision": self.precision.state_dict(),
                "step": step,
                "sampler": self.sampler.position(step),
                "num_train": self.d.num_train,
                "world_size": self.ctx.world_size,
                "ranks": ranks,
                "config": self.cfg.to_dict(),
                "summary": {k: self.summary[k] for k in ("best", "final") if k in self.summary},
                **extra,
            },
        )

    def _load_checkpoint(self) -> dict[str, Any] | None:
        """Rank 0 picks the newest usable checkpoint (falling back to the previous one with a
        warning); every rank reads that same file."""
        picked: dict[str, Any] = {}

        def pick() -> str | None:
            state = checkpoint.load(self.run_dir)
            if state is not None:
                _check_checkpoint(self.cfg, state, self.sampler)
                picked["state"] = state
            return None if state is None else state["file"]

        path = _on_main(self.ctx, pick)
        if path is None:
            return None
        return picked["state"] if self.ctx.is_main else checkpoint.read(Path(path))

    def _restore(self, state: dict[str, Any], net: torch.nn.Module, opt) -> int:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state.get("precision", {}))
        ranks = state.get("ranks")
        mine = self._rank_state(state)
        if mine is not None:
            _set_rng_state(mine, self.ctx.device)
            if "optimizer" in mine:  # local SGD: each process's own momentum
                opt.load_state_dict(mine["optimizer"])
        elif "rng" in state:  # format 1
            torch.set_rng_state(state["rng"])
        self.summary_resumed = state.get("summary", {})
        step = int(state["step"])
        if self.ctx.is_main:
            note = ""
            if ranks and len(ranks) != self.ctx.world_size:
                note = f" (saved by {len(ranks)} processes, resumed on {self.ctx.world_size})"
            print(f"lbsgd: resuming from {state.get('file')} at step {step}{note}", flush=True)
        return step

    def _throwaway_backward(self) -> None:
        """One training forward/backward on the first micro-batch that leaves no trace: buffers
        (BN statistics) and RNG states restored, gradients dropped. Training mode, because the
        order in which the backward pass produces gradients is what DDP's buckets follow."""
        x, y = next(
            data.batches(
                self.splits.train, [torch.arange(self.d.micro_batch)], device=self.ctx.device
            )
        )
        fmt = torch.channels_last if self.cfg.channels_last else torch.contiguous_format
        x = x.to(self.ctx.device, memory_format=fmt)
        buffers = [b.detach().clone() for b in self.net.buffers()]
        devices = [self.ctx.device] if self.ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            with self.precision.autocast():
                loss = torch.nn.functional.cross_entropy(self.model(x), y.to(self.ctx.device))
            loss.backward()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_(list(self.net.buffers()), buffers)

    def _rank_state(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """This process's part of the checkpoint, if it was saved by as many processes."""
        ranks = state.get("ranks")
        if ranks and len(ranks) == self.ctx.world_size:
            return ranks[self.ctx.rank]
        return None


def _check_checkpoint(cfg: Config, state: dict[str, Any], sampler: data.StepSampler) -> None:
    """Refuse a checkpoint made for other mathematics, or for another train split (a file
    dataset whose folder gained or lost images: another stream of samples)."""
    _same_experiment(cfg, state.get("config", {}), state["file"])
    saved = state.get("sampler")
    if saved is not None and (
        state.get("num_train") != sampler.num_samples
        or saved != sampler.position(int(state["step"]))
    ):
        raise ConfigError(
            f"checkpoint {state['file']!r} was made on a train split of {state.get('num_train')} "
            f"samples, this run's has {sampler.num_samples}: the data changed, resume is refused"
        )


def _seed(seed: int, device: torch.device) -> None:
    """Seed the generators a step draws from: the CPU's, and the training GPU's. (torch.manual_seed
    also queues seeds for every other device type, capturing a traceback for each, on every
    call: a measurable share of a small CPU step.)"""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the current device: distributed.init set it to ours


def _rng_state(device: torch.device) -> dict[str, torch.Tensor | None]:
    return {
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
