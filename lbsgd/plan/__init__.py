"""``lbsgd plan``: for a config's model and data, the batch sizes worth using, their lr and warmup,
the GPU count, and the predicted steps, epochs and wall time to a target; a recommended batch and
GPU count with a config that ``lbsgd train`` runs (docs/planning.md).

It measures on the machine at hand (:mod:`lbsgd.plan.measure`: a small-batch run to the target with
the noise probe on, or one it is pointed at; :mod:`lbsgd.plan.timer`: a worker's compute, the
largest micro-batch), takes
the interconnect from ``lbsgd bench allreduce`` or a named preset, and predicts
(:mod:`lbsgd.plan.model`). Every input is checked before anything runs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lbsgd import costmodel, data, entry, rundir
from lbsgd.config import Config, ConfigError, dump, load
from lbsgd.plan import lr_range, measure, model, timer
from lbsgd.plan.measure import Target
from lbsgd.plan.show import draw, render  # noqa: F401 (render: the text lbsgd plan prints)

DEFAULT_GPUS = (1, 2, 4, 8)
MIN_STEPS_PER_EPOCH = 8  # the largest batch planned leaves at least this many steps an epoch
EPOCHS_MARGIN = 2.0  # the recommended config's epochs: this times the predicted (it stops at an
# error target; a loss target gets the predicted epochs)


@dataclass(frozen=True)
class Request:
    """What ``lbsgd plan`` was asked, checked (:func:`request`)."""

    config: Config
    files: tuple[str, ...]
    overrides: tuple[str, ...]
    target: Target
    gpus: tuple[int, ...]
    link: costmodel.Link
    link_source: str
    out: Path
    reference: Path | None
    probe_epochs: float | None
    batches: tuple[int, ...]
    timing_samples: int | None
    timing_runs: int | None = None  # None: timer.TIMING_RUNS
    lr_rule: str | None = None  # None: the optimizer's (lbsgd.plan.model.DEFAULT_RULE)
    lr_test: bool = True  # run the lr range test (lbsgd.plan.lr_range)


def interconnect(text: str) -> tuple[costmodel.Link, str]:
    """A preset of :data:`lbsgd.costmodel.LINKS`, or ``bench:FILE`` (``lbsgd bench allreduce
    --out FILE``: its ring fit); one line naming ``--interconnect`` otherwise."""
    if text in costmodel.LINKS:
        link = costmodel.LINKS[text]
        return link, f"preset {text} (nominal: docs/planning.md#interconnect-presets)"
    if text.startswith("bench:"):
        path = Path(text.removeprefix("bench:"))
        try:
            doc = json.loads(path.read_text())
            fit = doc["fits"]["flat_ring"]
            link = costmodel.Link(float(fit["alpha_s"]), float(fit["bandwidth_Bps"]), "measured")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"--interconnect={text}: not a readable `lbsgd bench allreduce --out` file with a "
                f"ring fit ({type(e).__name__}: {e})"
            ) from None
        return link, (
            f"measured: {path} (lbsgd bench allreduce, {doc.get('backend')}, "
            f"{doc.get('world_size')} processes)"
        )
    raise ConfigError(
        f"--interconnect={text!r}: expected a preset ({', '.join(costmodel.LINKS)}) or "
        "bench:FILE (the JSON of `lbsgd bench allreduce --out FILE`)"
    )


def gpu_counts(text: str) -> tuple[int, ...]:
    """``1,2,4,8`` → (1, 2, 4, 8); one line naming ``--gpus`` otherwise."""
    try:
        counts = tuple(sorted({int(t) for t in text.split(",")}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 1:
        raise ConfigError(f"--gpus={text!r}: expected GPU counts >= 1, comma-separated (1,2,4,8)")
    return counts


def here_counts(cfg: Config) -> tuple[int, ...]:
    """``--gpus`` unset: 1, 2, 4, 8 where the run trains on CUDA devices (a node of the cluster
    it plans for); on a CPU, the powers of two up to the cores this process may use (a plan
    this machine can follow)."""
    import torch

    if cfg.device != "cpu" and torch.cuda.is_available():
        return DEFAULT_GPUS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return tuple(2**i for i in range((cores or 1).bit_length()))


def batch_range(cfg: Config, text: str | None) -> tuple[int, ...]:
    """The batch sizes planned: powers of two from the config's batch to the largest that leaves
    :data:`MIN_STEPS_PER_EPOCH` steps an epoch, or ``LO:HI``."""
    n = data.train_size(cfg)
    lo, hi = cfg.batch_size, max(cfg.batch_size, n // MIN_STEPS_PER_EPOCH)
    if text is not None:
        try:
            lo, hi = (int(v) for v in text.split(":"))
        except ValueError:
            lo = hi = 0
    batches = model.powers_of_two(max(lo, 1), hi) if 0 < lo <= hi else []
    if not batches:
        raise ConfigError(
            f"--batches={text!r}: expected LO:HI with 1 <= LO <= HI holding a power of two"
        )
    return tuple(batches)


def _check_numbers(args: Any) -> None:
    """--probe-epochs above 0, --timing-samples and --timing-runs at least 1: one line each."""
    if args.probe_epochs is not None and not args.probe_epochs > 0:
        raise ConfigError(f"--probe-epochs={args.probe_epochs}: expected a number of epochs > 0")
    if args.timing_samples is not None and args.timing_samples < 1:
        raise ConfigError(f"--timing-samples={args.timing_samples}: expected a number >= 1")
    if args.timing_runs is not None and args.timing_runs < 1:
        raise ConfigError(f"--timing-runs={args.timing_runs}: expected a number >= 1")


def request(args: Any) -> Request:
    """The command line's options checked, each with one line naming it; nothing runs before."""
    target = _target(args.target)
    rule = _rule(getattr(args, "lr_rule", None))
    gpus = gpu_counts(args.gpus) if args.gpus is not None else None
    link, source = interconnect(args.interconnect)
    reference = Path(args.reference) if args.reference else None
    _check_numbers(args)
    cfg = load(args.config, args.overrides)
    entry.check(cfg, 1, 1)  # the probe's model, data and this machine, before anything runs
    gpus = gpus or here_counts(cfg)
    out = _out(Path(args.out) if args.out else Path(cfg.out_dir) / "plans" / cfg.run_name())
    _check_reference(cfg, reference)
    if reference is None:  # the probe's keys (two micro-batches a step at least) hold
        entry.check(cfg.replace(**measure.probe_keys(cfg, target, out, args.probe_epochs)), 1, 1)
    batches = batch_range(cfg, args.batches)
    _check_split(cfg, args.gpus or ",".join(map(str, gpus)), gpus, batches)
    if warmup_lowers(cfg):
        _say(f"warning: {warmup_lowers(cfg)}")
    if target.kind == "error" and reference is None and cfg.holdout == 0:
        print(
            "lbsgd plan: note: holdout=0, so the error target is read on the test split "
            "(set holdout to keep the test split out of the plan)",
            flush=True,
        )
    return Request(
        cfg,
        tuple(args.config),
        tuple(args.overrides),
        target,
        gpus,
        link,
        source,
        out,
        reference,
        args.probe_epochs,
        batches,
        args.timing_samples,
        args.timing_runs,
        rule,
        not getattr(args, "no_lr_test", False),
    )


def warmup_lowers(cfg: Config) -> str | None:
    """Where the config's warmup lowers the lr (it starts above the peak it leads to), in words."""
    from lbsgd.config import derive

    d = derive(cfg, 1, data.train_size(cfg))
    if cfg.warmup == "none" or d.warmup_start_lr <= d.lr:
        return None
    return (
        f"warmup={cfg.warmup} lowers the lr, from {d.warmup_start_lr:g} (warmup_lr, null: "
        f"base_lr) to the peak {d.lr:g} at batch {cfg.batch_size} (base_lr {cfg.base_lr:g} at "
        f"reference_batch {cfg.reference_batch}, lr_scaling {cfg.lr_scaling}); set warmup=none, "
        "a lower warmup_lr or reference_batch"
    )


def _rule(text: str | None) -> str | None:
    if text is not None and text not in model.RULES:
        raise ConfigError(f"--lr-rule={text!r}: expected one of {', '.join(model.RULES)}")
    return text


def _target(text: str | None) -> Target:
    if text is None:
        raise ConfigError("--target: required (error=PCT or loss=VALUE), unless --check DIR")
    return Target.parse(text)


def _out(out: Path) -> Path:
    """A new folder (or one without a plan), else one line naming ``--out``."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out={out}: a file; expected a new folder for the plan")
    if (out / "plan.json").exists():
        raise ConfigError(f"--out={out}: holds a plan already (plan.json); choose a new folder")
    return out


def _check_reference(cfg: Config, reference: Path | None) -> None:
    """A run folder at the config's batch, else one line naming ``--reference``."""
    if reference is None:
        return
    ref, _ = measure.read_run(reference)
    if ref.batch_size != cfg.batch_size:
        raise ConfigError(
            f"--reference={reference}: its batch_size={ref.batch_size} is not the config's "
            f"{cfg.batch_size} (the plan's small batch)"
        )


def _check_split(cfg: Config, text: str, gpus: Sequence[int], batches: Sequence[int]) -> None:
    """Each GPU count splits some planned batch into shares of whole BN groups, else one line."""
    for p in gpus:
        if not any(b % (p * cfg.bn_batch) == 0 for b in batches):
            raise ConfigError(
                f"--gpus={text}: no batch of {batches[0]}..{batches[-1]} splits over {p} GPUs "
                f"in BN groups of bn_batch={cfg.bn_batch} (each GPU's share a multiple of it)"
            )


def _say(text: str) -> None:
    print(f"lbsgd plan: {text}", flush=True)


def probe(r: Request) -> measure.Probe:
    """The small-batch run: the one pointed at, else trained now into ``out/probe``."""
    if r.reference is not None:
        _say(f"1/4 reading the small-batch run {r.reference}")
        return measure.read_probe(r.reference, r.target, "pointed at")
    keys = measure.probe_keys(r.config, r.target, r.out, r.probe_epochs)
    cfg = r.config.replace(**keys)
    _say(
        f"1/4 probe run: batch {cfg.batch_size} with the noise probe (B_small "
        f"{cfg.noise_scale_batch}) to {r.target}, at most {cfg.epochs:g} epochs, in {cfg.run_dir()}"
    )
    return measure.read_probe(measure.run_probe(cfg), r.target, "ran")


def lr_test(r: Request, p: measure.Probe) -> lr_range.RangeTest | None:
    """The lr range test from the probe's lr at the largest planned batch above the probe's that
    the plan vouches for (at most :data:`lbsgd.plan.model.CHECKED_UP_TO` × B_crit), trained now
    into ``out/lr_range``; None where skipped or no batch is to be tested."""
    top = model.CHECKED_UP_TO * p.b_at_target
    batch = max((b for b in r.batches if p.batch < b <= top), default=None)
    if not r.lr_test or batch is None or not math.isfinite(p.lr):
        return None
    low, high = lr_range.span(p.lr, p.batch, batch)
    keys = lr_range.keys(r.config, batch, low, high)
    cfg = r.config.replace(**keys, out_dir=str(r.out), study="lr_range", resume=True)
    _say(
        f"2/4 lr range test: batch {batch}, lr {low:.3g} to {high:.3g} over {lr_range.STEPS} "
        f"steps, in {cfg.run_dir()}"
    )
    return lr_range.read(measure.run_probe(cfg))


def inputs_for(
    c: Config,
    p: measure.Probe,
    compute: model.Compute,
    link: costmodel.Link,
    grad_bytes: float,
    lr_rule: str | None = None,
    timed_gpus: int = 0,
    test: lr_range.RangeTest | None = None,
) -> model.Inputs:
    """The model's inputs: B_crit the probe's B_simple at the target (with its interval; a lower
    bound where B_simple still grows there), S_min from its steps there, the config's dataset
    size, optimizer, lr and warmup, the lr rule (None: the optimizer's) through the probe's lr,
    capped by the lr range test's bound (``test``)."""
    bound = (test.bound, test.batch, test.high) if test is not None else (None, 0, 0.0)
    return model.Inputs(
        b_crit=p.b_at_target,
        s_min=model.s_min_from(p.steps, p.batch, p.b_at_target),
        compute=compute,
        link=link,
        grad_bytes=grad_bytes,
        train_samples=data.train_size(c),
        config=c,
        lr=model.lr_of(c, p.b_at_target, lr_rule, p.batch, p.lr, bound),
        b_crit_range=p.b_range,
        steps_range=p.steps_range,
        timed_gpus=timed_gpus,
        b_crit_lower=math.isfinite(p.growth) and p.growth > GROWING,
    )


def recommended_config(r: Request, x: model.Inputs, best: model.Row) -> Config:
    """The config of the recommended row: its batch, micro-batch and lr; epochs enough for the
    predicted steps (twice them where the run stops at an error target)."""
    epochs = best.epochs * (EPOCHS_MARGIN if r.target.kind == "error" else 1.0)
    keys: dict[str, Any] = {
        **model.row_keys(x, best.batch),
        "micro_batch": best.micro_batch,
        "epochs": math.ceil(epochs * 100) / 100,
    }
    if r.target.kind == "error":  # evaluated log-spaced, as the probe: its steps measurable
        keys |= {"stop_at_error": r.target.value, "eval_per_octave": measure.PER_OCTAVE}
    return r.config.replace(**keys)


def plan(r: Request) -> dict[str, Any]:
    """Measure, predict, write ``plan.json``, ``plan.png`` and ``recommended.yaml`` into
    ``r.out``; the plan as a dict."""
    p = probe(r)  # a run pointed at that does not approach the target: one line, nothing written
    r.out.mkdir(parents=True, exist_ok=True)
    test = lr_test(r, p)
    log = r.out / "timing.log"
    _say(f"3/4 timing a worker's compute at three micro-batch sizes (their output: {log})")
    compute, timing = timer.time_compute(
        r.config, samples=r.timing_samples, runs=r.timing_runs, log=log
    )
    if max(r.gpus) > 1:
        _say(f"3/4 timing a step of {timer.SYNC_PROCESSES} processes")
        compute, info = timer.time_sync(
            r.config, compute, r.link, timing["grad_bytes"], r.timing_samples, r.timing_runs, log
        )
        timing = {**timing, **info}

    def inputs(c: model.Compute) -> model.Inputs:
        timed = timer.SYNC_PROCESSES if "parallel_per_sample_s" in timing else 1
        return inputs_for(r.config, p, c, r.link, timing["grad_bytes"], r.lr_rule, timed, test)

    x = inputs(compute)
    _say("4/4 predicting")
    rows = model.table(x, r.batches, r.gpus)
    best = model.recommend(rows)
    apart = rivals(
        lambda c: model.table(inputs(c), r.batches, r.gpus), compute, timing, r.link, best
    )
    best = None if apart else best
    rule, source = model.lr_rule(r.config.optimizer, r.lr_rule)
    doc = {
        "config": {"files": list(r.files), "overrides": list(r.overrides)},
        "target": str(r.target),
        "probe": asdict(p),
        "b_crit": x.b_crit,
        "b_crit_from": "B_simple (smoothed) at the target: McCandlish et al. 2018, B_crit ~ B_noise",
        "s_min": x.s_min,
        "e_min": x.s_min * x.b_crit,
        "s_min_from": f"S_min = S_ref / (1 + B_crit/B_ref), S_ref of the run at B_ref = {p.batch} ({p.source})"
        + (f"; {p.extrapolation}" if p.extrapolation else ""),
        "compute": {**asdict(x.compute), **timing},
        "interconnect": {
            "alpha_s": r.link.alpha_s,
            "bandwidth_Bps": r.link.bandwidth_Bps,
            "source": r.link_source,
        },
        "lr_rule": {
            "rule": rule,
            "source": source,
            "inputs": x.lr.describe(),
            **asdict(x.lr),
            "eps_max": x.lr.eps_max if rule == "saturating" else None,
        },
        "e_factor": model.E_FACTOR,
        "rows": [row.as_dict() for row in rows],
        "recommended": best.as_dict() if best is not None else {},
        "lr_range_test": asdict(test) if test is not None else None,
        "timing_steadiness": timer.steadiness(timing),
        "caveats": caveats(r, p, timing, apart) + _lr_caveats(r, test),
    }
    if best is not None:
        path = r.out / "recommended.yaml"
        with rundir.replacing(path) as tmp:
            tmp.write_text(dump(recommended_config(r, x, best)))
        doc["recommended"]["config"] = str(path)
        run = "lbsgd" if best.gpus == 1 else f"torchrun --nproc-per-node {best.gpus} -m lbsgd"
        doc["recommended"]["command"] = f"{run} train -c {path}"
    with rundir.replacing(r.out / "plan.json") as tmp:
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
    draw(doc, r.out / "plan.png")
    return doc


def rivals(rows_of, compute: model.Compute, timing: dict, link, best) -> list[str]:
    """Where the ranking rests on one round of timing runs: for each round left out, the row that
    the fastest runs of the others put more than :data:`~lbsgd.plan.timer.RANK_TOLERANCE`
    ahead of ``best`` (``rows_of``: the table at a compute)."""
    n = min(map(len, timing["trainer_step_runs_s"].values())) if best is not None else 0
    out = []
    for i in range(n if n > 1 else 0):
        rows = rows_of(timer.refit(compute, timing, link, [j for j in range(n) if j != i]))
        top = model.recommend(rows)
        same = next(w for w in rows if (w.batch, w.gpus) == (best.batch, best.gpus))
        if top is not None and same.wall_s > timer.RANK_TOLERANCE * top.wall_s:
            out.append(
                f"without round {i + 1}, batch {top.batch} on {top.gpus} GPU(s) x"
                f"{same.wall_s / top.wall_s:.2f} faster than batch {best.batch} on {best.gpus}"
            )
    return out


GROWING = 1.2  # B_simple growing faster than this per doubling of the steps at the target: the
# plan's B_crit is a lower bound (it grows as the loss falls, McCandlish et al. §3)


def caveats(r: Request, p: measure.Probe, timing: dict, apart: Sequence[str] = ()) -> list[str]:
    """What this plan cannot vouch for, each in a line: a warmup that lowers the lr, a ranking of
    the rows that rests on one round of timings (``apart``: :func:`rivals`), a noise scale still
    growing at the target, GPU counts beyond those timed, a model with no BatchNorm."""
    out = [warmup_lowers(r.config)] if warmup_lowers(r.config) else []
    if apart:
        out.append(
            f"the timing rounds rank the rows apart ({'; '.join(apart)}; more than "
            f"x{timer.RANK_TOLERANCE:g}): no row is recommended from them; plan again on a "
            "quieter machine, or with more --timing-runs"
        )
    if math.isfinite(p.growth) and p.growth > GROWING:
        out.append(
            f"B_simple still grows x{p.growth:.2f} per doubling of the steps at the target: "
            f"B_crit {p.b_at_target:.0f} is a lower bound, so the plan cannot vouch for the steps "
            "of the rows above the probe's batch (marked): they may need fewer, down to perfect "
            "scaling (their steps range)"
        )
    timed = timer.SYNC_PROCESSES if "parallel_per_sample_s" in timing else 1
    beyond = [g for g in r.gpus if g > timed]
    if beyond:
        out.append(
            f"the rows on {', '.join(map(str, beyond))} GPUs are extrapolated: {timed} "
            f"process{'es' if timed > 1 else ''} timed at once, the rest is the link's "
            "alpha-beta model"
        )
    if timing.get("bn_layers") == 0:
        out.append(
            f"the model has no BatchNorm layer: bn_batch={r.config.bn_batch} only sets the "
            "micro-batch's granule"
        )
    return out


def _lr_caveats(r: Request, test: lr_range.RangeTest | None) -> list[str]:
    """No lr range test run (skipped, or no batch above the probe's to test): the rows' lr
    rests on the rule alone."""
    if test is not None:
        return []
    why = "--no-lr-test" if not r.lr_test else "no planned batch above the probe's to test"
    return [f"no lr range test ({why}): no row's lr is checked against a measured bound"]
