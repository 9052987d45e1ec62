"""``lbsgd bench noise``: what ``noise_scale=true`` (lbsgd.noise_scale) costs, as the ratio of the
trainer's steady step time with it to the same run's without it, alternating in one invocation, in
three layouts (:func:`noise_layouts`); the target is at most :data:`NOISE_TARGET_PCT` % of the step.

Each side is the trainer's own steady throughput (:func:`lbsgd.bench.train.trainer_run`; the ddp
layout under torchrun, :func:`trainer_torchrun`).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from lbsgd import config
from lbsgd.bench import train as bench
from lbsgd.bench.torchrun import torchrun
from lbsgd.bench.train import Timing, trainer_run
from lbsgd.config import Config, ConfigError, derive, micro_batch
from lbsgd.trainer import SETTLING_STEPS

NOISE_LAYOUTS = ("accum", "half", "ddp")
NOISE_TARGET_PCT = 5.0  # the cost the measurement should stay under, in % of step time
# the global batch of 4 micro-batches: one process accumulates 4, two processes 2 each
NOISE_DEFAULTS = {"batch_size": 128, "micro_batch": 32, "bn_batch": 32, "reference_batch": 128}


def noise_layouts(cfg: Config, nproc: int) -> list[tuple[str, str, int, dict]]:
    """(name, description, processes, keys) of each layout measured, from the config's global batch
    B and micro-batch m (``noise_scale_batch`` = B_small):

    - ``accum``: one process accumulating B/m micro-batches, B_small = m: the worst case, a
      gradient difference, squared norm and copy after every micro-batch;
    - ``half``: one process, B_small = B/2: two small batches per step;
    - ``ddp``: ``nproc`` gloo processes (0: left out), B_small = the per-process share B/nproc: the
      DDP communication hook alone reads each bucket before its all-reduce.

    A layout the batch cannot make is a one-line ConfigError, before anything runs.
    """
    b, m = cfg.batch_size, micro_batch(cfg)
    if b % m or b // m < 2 or (b // m) % 2:
        raise ConfigError(
            f"lbsgd bench noise: batch_size={b} must be an even number (>= 2) of "
            f"micro_batch={m}: the layouts accumulate micro-batches (e.g. batch_size={4 * m})"
        )
    one = f"1 process, {b // m} micro-batches of {m}, B_small ="
    out = [
        ("accum", f"{one} micro_batch = {m}", 1, {"noise_scale_batch": m}),
        ("half", f"{one} batch/2 = {b // 2}", 1, {"noise_scale_batch": b // 2}),
    ]
    if nproc:
        if nproc < 2 or b % (nproc * m):
            raise ConfigError(
                f"--nproc={nproc}: the ddp layout needs >= 2 processes each with whole "
                f"micro-batches: batch_size={b} must be a multiple of {nproc} x micro_batch={m} "
                "(--layouts accum,half leaves the layout out)"
            )
        share = b // nproc
        what = (
            f"{nproc} gloo processes, {share // m} micro-batches of {m} each, "
            f"B_small = per-process share = {share} (the DDP hook alone)"
        )
        out.append(("ddp", what, nproc, {"noise_scale_batch": share}))
    return out


def trainer_torchrun(
    cfg: Config,
    steps: int,
    num_train: int,
    nproc: int,
    out_dir: str,
    what: str = "lbsgd bench noise",
    log: Path | None = None,
) -> Timing:
    """:func:`trainer_run` in ``nproc`` processes on this machine (one: this process; more:
    :func:`torchrun`, which never hangs on a worker that died): the trainer's own steady
    throughput of the global batch (rank 0's summary.json). ``what`` prefixes a failure's line;
    ``log``: where the workers' output goes (default: this process's)."""
    if nproc == 1:
        return trainer_run(cfg, steps, num_train, out_dir)
    run = cfg.replace(epochs=steps * cfg.batch_size / num_train, out_dir=out_dir, name="bench")
    keys = Path(out_dir) / "keys.yaml"
    keys.parent.mkdir(parents=True, exist_ok=True)
    keys.write_text(config.dump(run))
    torchrun(1, nproc, ["train", "-c", str(keys)], what=f"{what}: {nproc} processes", log=log)
    return bench.timing(json.loads((run.run_dir() / "summary.json").read_text()), steps, what)


def _alternating_runs(
    name: str, nproc: int, off: Config, on: Config, num_train: int, steps: int, repeats: int, tmp
) -> dict[str, list[Timing]]:
    """``repeats`` pairs of runs without and with the measurement, alternating which goes first
    (off then on, on then off, …), each pair printed; their timings by side."""
    sides = {
        "off": lambda r: trainer_torchrun(off, steps, num_train, nproc, f"{tmp}/{name}/{r}off"),
        "on": lambda r: trainer_torchrun(on, steps, num_train, nproc, f"{tmp}/{name}/{r}on"),
    }
    return bench.alternating(sides, repeats, on.compile, f"{name}: ")


def _noise_row(name: str, what: str, nproc: int, on: Config, num_train: int, runs: dict) -> dict:
    """One layout's row from its ``runs`` (:func:`_alternating_runs`); step time = global batch /
    the trainer's steady img/s. ``ratio``: the median over the repeats of each repeat's step time
    with / without (neighbours in time, so drifts in the machine's load cancel); the ratio of the
    median step times and of the best beside it."""
    ips = {k: [t.img_per_s for t in v] for k, v in runs.items()}
    ms = {k: [1e3 * on.batch_size / x for x in v] for k, v in ips.items()}  # step times
    # each repeat's two runs are neighbours in time: their ratio cancels drifts in machine load
    paired = [a / b for a, b in zip(ms["on"], ms["off"], strict=True)]
    ratio = statistics.median(paired)
    d = derive(on, nproc, num_train)
    return {
        "layout": name,
        "description": what,
        "nproc": nproc,
        "batch_size": on.batch_size,
        "micro_batch": d.micro_batch,
        "accum_steps": d.accum_steps,  # micro-batches per process per step
        "noise_scale_batch": d.noise_batch,
        "small_batches_per_process": d.accum_steps * d.micro_batch // d.noise_batch,
        "off_step_ms_median": statistics.median(ms["off"]),
        "on_step_ms_median": statistics.median(ms["on"]),
        "ratio": ratio,  # step time with / without, median over the repeats' pairs; 1 = free
        "paired_ratios": paired,
        "ratio_of_medians": statistics.median(ms["on"]) / statistics.median(ms["off"]),
        "ratio_best": min(ms["on"]) / min(ms["off"]),
        "overhead_pct": 100 * (ratio - 1),
        "target_pct": NOISE_TARGET_PCT,
        "within_target": 100 * (ratio - 1) <= NOISE_TARGET_PCT,
        "all_off_img_per_s": ips["off"],
        "all_on_img_per_s": ips["on"],
        "off_warmup_s": [t.warmup_s for t in runs["off"]],
        "on_warmup_s": [t.warmup_s for t in runs["on"]],
    }


def _measured_layouts(
    base: Config, layouts: Sequence[str], nproc: int, device: torch.device
) -> tuple[list, dict[str, str]]:
    """The layouts of ``layouts`` this machine can measure, and why any was left out (ddp: fewer
    GPUs than processes); a ConfigError when none is left."""
    measured = [
        lay for lay in noise_layouts(base, nproc if "ddp" in layouts else 0) if lay[0] in layouts
    ]
    left_out = {}
    if "ddp" in layouts and device.type == "cuda" and torch.cuda.device_count() < nproc:
        left_out["ddp"] = (
            f"{nproc} processes need {nproc} GPUs, {torch.cuda.device_count()} visible"
        )
        print(f"ddp layout left out: {left_out['ddp']}", flush=True)
        measured = [lay for lay in measured if lay[0] != "ddp"]
    if not measured:
        raise ConfigError(f"lbsgd bench noise: no layout to measure here ({left_out['ddp']})")
    return measured, left_out


def bench_noise(
    overrides: list[str],
    steps: int = 150,
    repeats: int = 5,
    nproc: int = 2,
    layouts: Sequence[str] = NOISE_LAYOUTS,
    out: str | None = None,
) -> dict:
    """The cost of ``noise_scale=true`` in each layout of :func:`noise_layouts`: the trainer's
    steady step time with the measurement over the same run's without it (same keys otherwise,
    same invocation, alternating; median of ``repeats``; the first steps timed apart as warm-up,
    the device waited for: the trainer's summary img_per_s). Keys over bench train's
    :data:`~lbsgd.bench.train.DEFAULTS` and :data:`NOISE_DEFAULTS`; ``layouts``: which of
    :data:`NOISE_LAYOUTS`."""
    given = config.parse_overrides(overrides)
    if "noise_scale" in given or "noise_scale_batch" in given:
        raise ConfigError(
            "lbsgd bench noise sets noise_scale and noise_scale_batch itself (each layout's "
            "B_small): leave both out"
        )
    defaults = {**bench.DEFAULTS, **NOISE_DEFAULTS}
    values, base, device, splits, env = bench.prepared(overrides, defaults)
    measured, left_out = _measured_layouts(base, layouts, nproc, device)
    pairs = [
        (
            config.from_dict({**values, **keys}),
            config.from_dict({**values, **keys, "noise_scale": True}),
        )
        for _, _, _, keys in measured
    ]
    num_train = len(splits.train)
    for (_, _, n, _), (_, on) in zip(measured, pairs, strict=True):
        derive(on, n, num_train)  # every layout refused up front, before anything runs
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # untimed: the process's first run pays for the allocator, the kernels' first calls and
        # the data, which would otherwise count against the first layout's first side
        trainer_run(pairs[0][0], min(steps, SETTLING_STEPS + 2), num_train, f"{tmp}/warm")
        for (name, what, n, _), (off, on) in zip(measured, pairs, strict=True):
            runs = _alternating_runs(name, n, off, on, num_train, steps, repeats, tmp)
            row = _noise_row(name, what, n, on, num_train, runs)
            rows.append(row)
            print(
                f"{name:<6} {what}\n       step {row['off_step_ms_median']:7.2f} ms without, "
                f"{row['on_step_ms_median']:7.2f} ms with noise_scale | step time ratio "
                f"{row['ratio']:.3f} (of medians {row['ratio_of_medians']:.3f}, best "
                f"{row['ratio_best']:.3f}) = "
                f"{row['overhead_pct']:+.1f}% (target <= {NOISE_TARGET_PCT:g}%)",
                flush=True,
            )
    result = {
        "benchmark": "noise_scale=true: trainer step time with / without",
        **bench.header(base, steps, repeats, device, env),
        "target_pct": NOISE_TARGET_PCT,
        "rows": rows,
        "left_out": left_out,
    }
    bench.write(result, out)
    return result
