"""What a plan measures on the machine at hand: a small-batch run to the target with the noise
probe on (the steps it took, B_simple and its trend), a worker's compute per micro-batch and per
sample, the backward's share of it, and the largest micro-batch that fits.

The run is an ordinary ``lbsgd train`` run (``noise_scale=true``; for an error target
``stop_at_error`` and ``eval_per_octave``, so it ends at the evaluation that reaches the target),
or one already made that the plan is pointed at. Reading it needs only its ``config.yaml`` and
``metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lbsgd import data, distributed, models, network, optim, tracking
from lbsgd.config import Config, ConfigError, load, lr_scale
from lbsgd.models import ghost_bn
from lbsgd.plan import model
from lbsgd.plan.model import Compute, fit_compute

ERROR_KEY = "val_top1_error_pct"  # the held-out error (the test split's without a holdout)
PER_OCTAVE = 4  # the probe's evaluations per doubling of the step count (study 15's)
LOSS_WINDOW_EPOCHS = 0.1  # a loss target reads the training loss's moving average over this
EXTRAPOLATE_AT_MOST = 4.0  # a target past the probe's end by more than this factor is refused
TREND_POINTS = (0.1, 0.25, 0.5, 0.75, 1.0)  # B_simple at these shares of the probe's steps


@dataclass(frozen=True)
class Target:
    """``error`` (held-out top-1 error, %) or ``loss`` (the training loss's moving average)."""

    kind: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        kind, _, value = text.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        ok = (kind == "error" and 0 < v < 100) or (kind == "loss" and v > 0)
        if not ok:
            raise ConfigError(
                f"--target={text!r}: expected error=PCT (held-out top-1 error, 0 < PCT < 100) "
                "or loss=VALUE (training loss, > 0)"
            )
        return cls(kind, v)

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


@dataclass
class Probe:
    """What the small-batch run measured."""

    run_dir: str
    source: str  # "ran" (the plan trained it) or "pointed at" (--reference)
    batch: int
    steps: float  # to the target (measured, or extrapolated: ``extrapolation`` names how)
    last_step: int
    extrapolation: str | None
    b_at_target: float  # the smoothed B_simple at the target (at the end when extrapolated)
    trend: list[tuple[int, float]] = field(default_factory=list)  # (step, B_simple) over the run
    growth: float = math.nan  # B_simple's growth per doubling of the steps (second half, fitted)
    img_per_s: float = math.nan  # the run's own throughput, steady state (median of its flushes)
    lr: float = math.nan  # its peak lr
    b_range: tuple[float, float] | None = None  # B at the target: 95% interval (noise_interval)
    steps_range: tuple[float, float] | None = None  # its steps: the evaluations around them


# -- the run -------------------------------------------------------------------------------------


def probe_keys(cfg: Config, target: Target, out: Path, probe_epochs: float | None) -> dict:
    """The keys over ``cfg`` of the probe run: the noise probe on at small batches of one
    micro-batch (two at least per step), for an error target ending where it reaches it."""
    micro = cfg.micro_batch if isinstance(cfg.micro_batch, int) else cfg.bn_batch
    if cfg.batch_size < 2 * micro:
        raise ConfigError(
            f"batch_size={cfg.batch_size}: the plan's probe needs at least two micro-batches of "
            f"{micro} per step to measure the noise scale; use batch_size >= {2 * micro}"
        )
    keys = {
        "noise_scale": True,
        "noise_scale_batch": micro,
        "out_dir": str(out),
        "study": "probe",
        "resume": True,  # an interrupted plan's probe goes on where it stopped
    }
    if target.kind == "error":
        keys |= {"stop_at_error": target.value, "eval_per_octave": PER_OCTAVE}
    if probe_epochs is not None:
        keys["epochs"] = probe_epochs
    return keys


def run_probe(cfg: Config) -> Path:
    """Train the probe run (in this process); its folder. A run asked to stop (Ctrl-C, SIGTERM:
    it stops at a flush with a checkpoint, which the same plan again resumes from) is an
    interrupt of the plan, not a probe to read."""
    from lbsgd.entry import train

    if train(cfg)["status"] == "interrupted":
        raise KeyboardInterrupt(f"{cfg.study} run stopped at a checkpoint in {cfg.run_dir()}")
    return cfg.run_dir()


# -- reading a run -------------------------------------------------------------------------------


def read_run(run_dir: Path) -> tuple[Config, list[dict]]:
    """(the config, metrics.jsonl's records) of a run; one line if it has none."""
    cfg_file, metrics = Path(run_dir, "config.yaml"), Path(run_dir, "metrics.jsonl")
    if not cfg_file.is_file() or not metrics.is_file():
        raise ConfigError(
            f"--reference={run_dir}: not a run folder (needs its config.yaml and metrics.jsonl)"
        )
    return load([cfg_file]), tracking.read_records(metrics)


NOISE_WINDOW = 2**-0.5  # the noise scale's interval reads the steps from this share of the target's
NOISE_BLOCKS = 10  # in this many consecutive blocks of steps (neighbouring steps' estimates
# share their EMA's history, blocks far less), resampled
NOISE_RESAMPLES = 2000


def noise_interval(records: Sequence[dict], at: float) -> tuple[float, float] | None:
    """A 95% interval of the noise scale at step ``at``: tr(Σ) over |G|² of the steps' unsmoothed
    estimates in the half octave before it, cut into :data:`NOISE_BLOCKS` consecutive blocks
    whose means are resampled in pairs (scipy's bootstrap, percentile, a fixed generator); None
    with too few steps or a |G|² that comes out at or below zero."""
    from scipy import stats as sps

    pts = [
        (r["gns_trace"], r["gns_g_sq"])
        for r in records
        if r.get("kind") == "train"
        and r.get("gns_g_sq") is not None
        and r.get("gns_trace") is not None
        and NOISE_WINDOW * at <= r["step"] <= at
    ]
    if len(pts) < 2 * NOISE_BLOCKS:
        return None
    blocks = np.array_split(np.array(pts, dtype=float), NOISE_BLOCKS)
    trace, g_sq = (np.array([b[:, i].mean() for b in blocks]) for i in (0, 1))
    if g_sq.mean() <= 0:
        return None
    res = sps.bootstrap(
        (trace, g_sq),
        lambda t, g, axis=-1: t.mean(axis=axis) / np.clip(g.mean(axis=axis), 1e-30, None),
        paired=True,
        n_resamples=NOISE_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def crossing_bracket(points: Sequence[tuple[float, float]], target: float):
    """The steps of the evaluation before the first that reaches ``target`` and of that one: the
    first crossing lies between them (None where it never does, or at the first point)."""
    for i, (s, v) in enumerate(points):
        if v <= target:
            return (float(points[i - 1][0]), float(s)) if i else None
    return None


def first_crossing(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first step where the (step, value) curve reaches ``target`` (≤), interpolated between
    that point and the one before linearly in log step; None if it never does."""
    for i, (s, v) in enumerate(points):
        if v <= target:
            if i == 0:
                return float(s)
            s0, v0 = points[i - 1]
            frac = (v0 - target) / (v0 - v)
            return float(2 ** (math.log2(s0) + frac * math.log2(s / s0)))
    return None


def _tail_fit(points: Sequence[tuple[float, float]]):
    """(slope, intercept) of log value on log step, least squares over the second half of the
    steps; None with fewer than three points there."""
    tail = [(s, v) for s, v in points if s >= points[-1][0] / 2 and v > 0]
    if len(tail) < 3 or tail[-1][0] <= tail[0][0]:
        return None
    return np.polyfit(np.log([s for s, _ in tail]), np.log([v for _, v in tail]), 1)


def extrapolate(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The step where a power law value = a·step^(−c), fitted to the second half of the curve's
    steps (:func:`_tail_fit`), reaches ``target``; None when the curve does not fall."""
    fit = _tail_fit(points)
    if fit is None or fit[0] >= 0:
        return None
    return float(math.exp((math.log(target) - fit[1]) / fit[0]))


def noise_trend(records: Sequence[dict], last: float) -> tuple[list[tuple[int, float]], float]:
    """B_simple (smoothed) at :data:`TREND_POINTS` of the steps up to ``last``, and its growth
    per doubling of the steps: 2^slope of log B on log step over the second half of the steps
    (:func:`_tail_fit`; NaN with fewer than three points there)."""
    pts = sorted(
        (r["step"], r["gns_b_simple_ema"])
        for r in records
        if r.get("kind") == "train"
        and r.get("gns_b_simple_ema") is not None
        and r["step"] <= math.ceil(last)
    )
    if not pts:
        raise ConfigError(
            "the probe run measured no noise scale (noise_scale=true with at least two small "
            "batches per step)"
        )
    trend = [
        min(pts, key=lambda p: abs(p[0] - max(1, round(f * pts[-1][0])))) for f in TREND_POINTS
    ]
    fit = _tail_fit(pts)
    growth = math.nan if fit is None else float(2 ** fit[0])
    return [(int(s), float(b)) for s, b in trend], growth


def curve(cfg: Config, records: Sequence[dict], target: Target) -> list[tuple[float, float]]:
    """The (step, value) curve a target is read on, by step: the held-out error of the
    evaluations, or the training loss's moving average over :data:`LOSS_WINDOW_EPOCHS` from the
    first full window."""
    if target.kind == "error":
        pts = {
            r["step"]: r[ERROR_KEY] for r in records if r.get("kind") == "eval" and ERROR_KEY in r
        }
        return sorted((float(s), float(v)) for s, v in pts.items() if v is not None)
    window = max(1, round(LOSS_WINDOW_EPOCHS * data.train_size(cfg) / cfg.batch_size))
    train = sorted((r["step"], r["loss"]) for r in records if r.get("kind") == "train")
    if len(train) < window:
        return []
    steps, loss = np.array(train, dtype=float).T  # a loss of None: NaN
    avg = np.convolve(loss, np.ones(window) / window, mode="valid")
    return list(zip(steps[window - 1 :].tolist(), avg.tolist(), strict=True))


def steps_to(curve: Sequence[tuple[float, float]], target: Target, last: int):
    """(steps to the target, how they were extrapolated or None): the first crossing, else the
    power law past the run's end; one line when the run is there at its first point or does not
    approach the target (the power law reaching past :data:`EXTRAPOLATE_AT_MOST` × its steps)."""
    steps = first_crossing(curve, target.value)
    if steps is not None and steps <= curve[0][0]:
        raise ConfigError(
            f"--target={target}: the run is there at its first point (step {curve[0][0]:.0f}), "
            "so its steps to the target say nothing; choose a harder target"
        )
    if steps is not None:
        return steps, None
    steps = extrapolate(curve, target.value)
    if steps is None or steps > EXTRAPOLATE_AT_MOST * last:
        raise ConfigError(
            f"--target={target}: the probe's {target.kind} ends at {curve[-1][1]:.4g} after "
            f"{last} steps and does not approach {target.value:g} (a power law through its "
            f"second half reaches it {'never' if steps is None else f'at step {steps:.0f}'}; "
            f"at most {EXTRAPOLATE_AT_MOST:g}x the probe's steps are extrapolated)"
        )
    return steps, (
        f"extrapolated: a power law {target.kind} = a*step^-c fitted to the second half of the "
        f"probe's {len(curve)} points, from its last step {last}"
    )


def read_probe(run_dir: Path, target: Target, source: str) -> Probe:
    """The probe's measurements from a run's files; one line when the run does not approach the
    target (:func:`steps_to`)."""
    cfg, records = read_run(run_dir)
    points = curve(cfg, records, target)
    if not points:
        raise ConfigError(f"--target={target}: the run in {run_dir} has no {target.kind} curve")
    last = int(max(r["step"] for r in records if "step" in r))
    steps, how = steps_to(points, target, last)
    trend, growth = noise_trend(records, min(steps, last))
    b_target = trend[-1][1]
    if how is not None and math.isfinite(growth):  # B_simple carried on along its trend
        b_target *= growth ** math.log2(steps / trend[-1][0])
    b_range = noise_interval(records, min(steps, last))  # widened to hold the EMA's reading
    if b_range is not None:  # there, and carried on to the target as the reading is
        lo, hi = min(b_range[0], trend[-1][1]), max(b_range[1], trend[-1][1])
        b_range = lo * b_target / trend[-1][1], hi * b_target / trend[-1][1]
    rates = [r["img_per_s"] for r in records if r.get("kind") == "train" and r.get("img_per_s")]
    return Probe(
        run_dir=str(run_dir),
        source=source,
        batch=cfg.batch_size,
        steps=float(steps),
        last_step=last,
        extrapolation=how,
        b_at_target=float(b_target),
        trend=trend,
        growth=growth,
        img_per_s=float(statistics.median(rates[len(rates) // 2 :])) if rates else math.nan,
        lr=cfg.base_lr * lr_scale(cfg.lr_scaling, cfg.batch_size / cfg.reference_batch),
        b_range=b_range,
        steps_range=crossing_bracket(points, target.value) if how is None else None,
    )


# -- compute -------------------------------------------------------------------------------------


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
from lbsgd.plan import measure
compute, info = measure.time_compute_here(cfg, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
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
    from lbsgd.bench.train import trainer_run

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
        if processes == 1:
            timing = trainer_run(run, steps, n, tmp)
        else:
            timing = trainer_torchrun(
                run, steps, n, processes, tmp, "lbsgd plan, timing a step", log
            )
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
