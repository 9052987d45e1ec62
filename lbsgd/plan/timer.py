"""What a plan times on the machine at hand: a worker's compute per micro-batch and per sample
(the trainer's own step, in a fresh process whose CPU kernels are the config's), the backward's
share of it, the largest micro-batch that fits, and a step of two processes (the shared machine's
slope and what a step costs beyond compute and the all-reduce)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from lbsgd import data, distributed, models, network, optim
from lbsgd.config import Config, ConfigError
from lbsgd.models import ghost_bn
from lbsgd.plan import model
from lbsgd.plan.model import Compute, fit_compute


def largest_micro(cfg: Config, net, splits, device: torch.device, precision) -> tuple[int, str]:
    """The largest micro-batch of bn_batch × 2^j that fits, and how it was found: on CUDA by a
    peak-memory probe of one forward/backward (micro_batch=auto's), on a CPU by its rule."""
    if device.type != "cuda":
        return network.CPU_AUTO_MICRO_BATCH, "cpu rule of micro_batch=auto (no memory probe)"
    total = torch.cuda.get_device_properties(device).total_memory
    m, best = cfg.bn_batch, 0
    while m <= 65_536:
        if network.peak_memory(net, m, splits, cfg, device, precision) > (
            network.GPU_MEMORY_SHARE * total
        ):
            break
        best, m = m, 2 * m
    if not best:
        raise ConfigError(f"bn_batch={cfg.bn_batch}: not one BN group fits in {device}'s memory")
    return best, f"peak-memory probe on {torch.cuda.get_device_name(device)}"


def _timed(fn, repeats: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after two untimed ones."""
    times = []
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# run in a fresh interpreter by :func:`time_compute`: the CPU kernels capped before torch loads
_FRESH = """
import dataclasses, json, sys
from lbsgd import config, isa
cfg = config.load([sys.argv[1]])
isa.pin(cfg.cpu_isa)
isa.require(cfg.cpu_isa)
from lbsgd.plan import timer
compute, info = timer.time_compute_here(cfg, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
print(json.dumps({"compute": dataclasses.asdict(compute), "info": info}))
"""


def time_compute(
    cfg: Config,
    repeats: int = 5,
    samples: int | None = None,
    runs: int | None = None,
    log: Path | None = None,
) -> tuple[Compute, dict]:
    """:func:`time_compute_here` in a fresh Python process, whose CPU kernels are the config's
    (``cpu_isa``: pinned before torch loads, as a run's are; a process that has run torch already,
    a notebook's kernel, keeps its own, and ``portable`` alone makes ResNet-8's step several times
    slower). ``log``: a file the timing runs' output is appended to (default: dropped)."""
    import sys
    import tempfile

    from lbsgd.config import dump

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(dump(cfg))
        n, r = str(samples or timed_samples(cfg)), str(runs or TIMING_RUNS)
        argv = [sys.executable, "-c", _FRESH, str(path), str(repeats), n, r]
        doc = json.loads(_streamed(argv, log))
    return Compute(**doc["compute"]), doc["info"]


def _streamed(argv: list[str], log: Path | None) -> str:
    """Run ``argv``: its ``lbsgd plan:`` lines printed here as they come, the rest appended to
    ``log`` (default: dropped); its last line. An interrupt here (Ctrl-C, SIGTERM) ends it."""
    import subprocess

    last, pipe = "no output", {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    with open(log or os.devnull, "a") as sink, subprocess.Popen(argv, text=True, **pipe) as p:
        try:
            for last in p.stdout:
                if last.startswith("lbsgd plan: "):
                    print(last, end="", flush=True)
                elif not last.startswith("{"):
                    sink.write(last)
        except BaseException:
            p.kill()  # its timing runs are thrown away: nothing to keep
            raise
    if p.returncode:
        raise RuntimeError(f"timing the compute failed: {last.strip()}")
    return last


TIMED_SAMPLES = 4096  # each trainer timing run: at least this many samples (and 40 steps)
# on a GPU: runs of 4,096 samples of ResNet-50 (launch-bound at one BN group of 32) timed the same
# step 19.7 and 30.2 ms on one H100 in two calls, so the plan missed its runs by up to 33%; at
# 16,384 it came within 7% (results/gpu/h100-plan/)
TIMED_SAMPLES_CUDA = 16384
# short runs per timed size, the fastest taken: on the 2-core development machine two timings of
# the same ResNet-8 step at 128, a minute apart, read 49.9 and 71.1 ms (a slow spell of seconds),
# and one such spell put every 1-process prediction of a sitting 40-57% high
TIMING_RUNS = 3


def timed_samples(cfg: Config) -> int:
    """The samples of each timing run by default: :data:`TIMED_SAMPLES`, on a GPU
    :data:`TIMED_SAMPLES_CUDA`."""
    kind, _ = distributed.resolve(cfg.device, cfg.backend)
    return TIMED_SAMPLES_CUDA if kind == "cuda" else TIMED_SAMPLES


def time_compute_here(
    cfg: Config, repeats: int = 5, samples: int | None = None, runs: int | None = None
) -> tuple[Compute, dict]:
    """A worker's compute, in this process as its CPU kernels are, at the config's threads:

    - per micro-batch and per sample, fitted to the trainer's own steady step time (summary.json's
      img_per_s: the sampler, ghost BN, the update and the metric flushes included) in three
      short runs of one micro-batch a step, of one BN group, two, and the largest that fits (up
      to 8 groups), each at least ``samples`` (default :func:`timed_samples`) and 40 steps long,
      the fastest of ``runs`` (default :data:`TIMING_RUNS`) rounds (:func:`_rounds`): the line
      through the two larger, the one-group step apart (:func:`fit_compute`);
    - the backward's share of a micro-batch, from timings of the network's training forward,
      forward + backward + update and the update alone (median of ``repeats``, ghost BN as runs
      have it, random inputs of the dataset's shape).

    Returns the compute and what was timed."""
    from lbsgd.precision import Precision

    kind, _ = distributed.resolve(cfg.device, cfg.backend)
    device = torch.device(kind)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    splits = data.build(cfg, torch.device("cpu"))
    net = models.build(cfg, splits.num_classes, splits.image_size).to(device)
    ghost_bn.convert(net, cfg.bn_batch)
    precision = Precision(cfg.precision, device, cfg.loss_scale)
    max_micro, how = largest_micro(cfg, net, splits, device, precision)
    top = min(max_micro, 8 * cfg.bn_batch)
    sizes = sorted({m for m in (cfg.bn_batch, 2 * cfg.bn_batch, top) if m <= top})
    n = samples or timed_samples(cfg)
    each, load = _rounds(sizes, runs or TIMING_RUNS, lambda m: _step_s(cfg, m, n), "")
    steps = fastest(each)
    per_micro, per_sample, one_group = fit_compute(steps, cfg.bn_batch)
    full, fwd, upd = _parts(cfg, net, splits, top, device, precision, repeats)
    backward = min(1.0, max(0.0, (full - fwd - upd) / full))
    info = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "trainer_step_s": {str(m): t for m, t in steps.items()},
        "trainer_step_runs_s": {str(m): ts for m, ts in each.items()},
        "load_average": load,
        "parts_s": {"micro_batch": top, "step": full, "forward": fwd, "update": upd},
        "max_micro_batch": max_micro,
        "max_micro_batch_from": how,
        "grad_bytes": 4 * models.parameter_count(cfg, splits.num_classes, splits.image_size),
        "bn_layers": len(ghost_bn.ghost_modules(net)),
        "cpu_isa": cfg.cpu_isa,
    }
    return Compute(
        per_micro, per_sample, backward, max_micro, one_group_s=one_group, group=cfg.bn_batch
    ), info


def _rounds(sizes, runs: int, timed, who: str) -> tuple[dict[int, list[float]], list[float]]:
    """``runs`` rounds of one timing run a size (``timed(m)``: its step, seconds), a line each; a
    round times every size, so that a slow spell of the machine falls on a round, not on a size.
    The steps by size, and the machine's load average (1 minute) after each run."""
    each: dict[int, list[float]] = {m: [] for m in sizes}
    load = []
    for r in range(runs):
        for m in sizes:
            each[m].append(timed(m))
            load.append(os.getloadavg()[0])
            print(
                f"lbsgd plan: 3/4 timing round {r + 1}/{runs}{who}, micro-batch {m}: "
                f"{each[m][-1] * 1e3:.2f} ms a step (load average {load[-1]:.1f})",
                flush=True,
            )
    return each, load


def fastest(runs: dict, rounds: Sequence[int] | None = None) -> dict[int, float]:
    """Each size's fastest run (of ``rounds``; all by default): what contention for the machine
    cannot lower, so the plan times by it, as ``timeit`` does."""
    pick = range(max(map(len, runs.values()))) if rounds is None else rounds
    return {int(m): min(ts[i] for i in pick) for m, ts in runs.items()}


def _step_s(cfg: Config, m: int, samples: int, log: Path | None = None, processes: int = 1):
    """The trainer's steady seconds per step of ``processes`` processes of one micro-batch of
    ``m`` each (a short run, no probe, no evaluation, nothing kept; several: torchrun under
    lbsgd.bench's watch, a worker that hangs stopped, not waited for)."""
    import tempfile

    from lbsgd.bench.noise import trainer_torchrun

    run = cfg.replace(
        batch_size=processes * m,
        micro_batch=m,
        noise_scale=False,
        noise_scale_batch=None,
        stop_at_error=None,
        eval_every=0,
        eval_per_octave=0,
        checkpoint=False,
        wandb="disabled",
        study="timing",
        resume=False,
    )
    steps, n = max(40, math.ceil(samples / run.batch_size)), data.train_size(run)
    with tempfile.TemporaryDirectory() as tmp:
        timing = trainer_torchrun(run, steps, n, processes, tmp, "lbsgd plan, timing a step", log)
    return run.batch_size / timing.img_per_s


def _parts(cfg, net, splits, m: int, device, precision, repeats: int) -> tuple[float, ...]:
    """(forward + backward + update, the training forward alone, the update alone) seconds of
    one micro-batch of ``m`` random inputs."""
    x = torch.randn(m, 3, splits.image_size, splits.image_size, device=device)
    x = x.contiguous(memory_format=network.memory_format(cfg))
    y = torch.randint(0, splits.num_classes, (m,), device=device)
    opt, loss_fn = optim.build(cfg, net), torch.nn.functional.cross_entropy

    def full():
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    with precision.autocast():
        t_full = _timed(full, repeats, device)
        t_fwd = _timed(lambda: loss_fn(net(x), y), repeats, device)  # its graph dropped unused
        return t_full, t_fwd, _timed(opt.step, repeats, device)  # the last step's gradients


# The recommendation holds when leaving out any one round of timing runs leaves it within this
# factor of the fastest row (the ranking itself does not rest on one round's noise)
RANK_TOLERANCE = 1.1


def steadiness(timing: dict) -> dict:
    """How far each timed size's runs lie apart (slowest over fastest), and the fitted per-sample
    slope round by round (the i-th run of each size together): of one process alone and of
    :data:`SYNC_PROCESSES` at once, where timed; the machine's load average over the runs."""
    load = timing.get("load_average", []) + timing.get("parallel_load_average", [])
    out: dict = {"tolerance": RANK_TOLERANCE, "load_average": load, "cores": os.cpu_count()}
    for key, who in (("trainer_step_runs_s", "1"), ("parallel_step_runs_s", str(SYNC_PROCESSES))):
        runs = {int(m): ts for m, ts in timing.get(key, {}).items()}
        if not runs:
            continue
        m1, m2 = sorted(runs)[-2:] if len(runs) > 1 else (None, None)
        slopes = (
            [(b - a) / (m2 - m1) for a, b in zip(runs[m1], runs[m2], strict=False)] if m1 else []
        )
        out[who] = {
            "runs": min(map(len, runs.values())),
            "apart": {m: max(ts) / min(ts) for m, ts in runs.items()},
            "slopes_s": slopes,
        }
    return out


def refit(compute: Compute, timing: dict, link, rounds: Sequence[int]) -> Compute:
    """``compute`` fitted again to the fastest runs of ``rounds`` alone (one process's, then the
    several processes' where timed)."""
    micro, sample, one = fit_compute(fastest(timing["trainer_step_runs_s"], rounds), compute.group)
    c = dataclasses.replace(compute, per_micro_s=micro, per_sample_s=sample, one_group_s=one)
    two = timing.get("parallel_step_runs_s")
    return fit_sync(c, fastest(two, rounds), link, timing["grad_bytes"]) if two else c


def fit_sync(compute: Compute, steps: dict[int, float], link, grad_bytes: float) -> Compute:
    """``compute`` with what two processes at once cost, from their steps at two micro-batches
    ``{m: seconds}``: the slope a sample's compute among workers, the rest of the smaller step
    beyond the model's compute and the α–β all-reduce ``sync_s``."""
    (m1, t1), (m2, t2) = sorted(steps.items())
    fitted = dataclasses.replace(
        compute, parallel_per_sample_s=max(0.0, (t2 - t1) / (m2 - m1)), sync_s=0.0
    )
    predicted, _, _ = model.step_time(fitted, m1, m1, SYNC_PROCESSES, grad_bytes, link)
    return dataclasses.replace(fitted, sync_s=max(0.0, t1 - predicted))


SYNC_PROCESSES = 2  # the processes of the run that measures ``sync_s``


def devices_here(cfg: Config) -> int:
    """The workers this machine can run at once: its GPUs on CUDA, its cores on a CPU."""
    kind, _ = distributed.resolve(cfg.device, cfg.backend)
    return torch.cuda.device_count() if kind == "cuda" else (os.cpu_count() or 1)


PARALLEL_GROUPS = 6  # the larger share per process of the 2-process fit, in BN groups (the
# smaller: one group); 6 groups a process is a batch (192 at bn_batch 16) study 16 does not time


def time_sync(
    cfg: Config,
    compute: Compute,
    link,
    grad_bytes: float,
    samples: int | None = None,
    runs: int | None = None,
    log: Path | None = None,
) -> tuple[Compute, dict]:
    """``compute`` with what two processes at once cost (:func:`fit_sync`), from the trainer's
    steady step of two processes (torchrun on this machine, its output kept out of this
    process's), one micro-batch of two BN groups and of :data:`PARALLEL_GROUPS` groups each (both
    past the one-group step's own kernels, as :func:`time_compute_here`'s line), the fastest of
    ``runs`` rounds. Unchanged, and said so, on a machine with one device. A fit as Pollux fits
    its throughput model to observed steps, at batches study 16 does not check."""
    if devices_here(cfg) < SYNC_PROCESSES:
        return compute, {"sync_s": 0.0, "sync_from": "not measured: one device here"}
    m1, m2 = 2 * cfg.bn_batch, PARALLEL_GROUPS * cfg.bn_batch
    n, who = samples or timed_samples(cfg), f" of {SYNC_PROCESSES} processes"
    each, load = _rounds(
        (m1, m2), runs or TIMING_RUNS, lambda m: _step_s(cfg, m, n, log, SYNC_PROCESSES), who
    )
    t1, t2 = fastest(each).values()
    fitted = fit_sync(compute, {m1: t1, m2: t2}, link, grad_bytes)
    among, sync = fitted.parallel_per_sample_s, fitted.sync_s
    return fitted, {
        "sync_s": sync,
        "parallel_per_sample_s": among,
        "parallel_step_runs_s": {str(m): ts for m, ts in each.items()},
        "parallel_load_average": load,
        "sync_from": f"{SYNC_PROCESSES} processes of {m1} and {m2} samples: steps "
        f"{t1 * 1e3:.2f} and {t2 * 1e3:.2f} ms measured; a sample {among * 1e6:.1f} us among "
        f"them ({compute.per_sample_s * 1e6:.1f} alone), {sync * 1e3:.2f} ms a step beyond",
    }
