"""``lbsgd bench train``: the trainer against a minimal hand-written PyTorch loop, same everything.

Both sides train the same model, data (resident on the device), batch, precision, compilation and
optimizer for the same steps; the bare loop is what a tutorial writes (plain BN over the
micro-batch, so a ghost-BN row measures ghost BN's cost too). The first ``SETTLING_STEPS`` are
timed apart, the sides alternate so that drifts in load hit both, and each side's best throughput
is compared (ratio = trainer / bare, the medians' beside it). ``--matrix`` measures every
precision × compile × layout (``plain``, ``ghost_bn``, ``accum``) in one process; docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
import json
import platform
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from lbsgd import config, data, distributed, models, registry, rundir
from lbsgd.config import Config, ConfigError, derive, micro_batch
from lbsgd.environment import environment
from lbsgd.trainer import SETTLING_STEPS

# The CPU default: one thread per process, the quickstart model, one micro-batch per step.
DEFAULTS = {
    "model": "resnet",
    "depth": 8,
    "width": 16,
    "zero_init_residual": False,
    "batch_size": 32,
    "bn_batch": 32,
    "reference_batch": 32,
    "warmup": "none",
    "schedule": "cosine",
    "threads": 1,
    "wandb": "disabled",
    "checkpoint": False,
    "eval_every": 0,
    "synthetic_test": 1000,
}
PRECISIONS = ("fp32", "bf16", "fp16")
LAYOUTS = ("plain", "ghost_bn", "accum")
_AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Timing(NamedTuple):
    img_per_s: float  # steady throughput: the warm-up steps left out
    warmup_s: float | None  # seconds of the first SETTLING_STEPS steps (None: none timed)


def bench_device(cfg: Config) -> torch.device:
    """The device both sides run on: the ``device`` key resolved (a one-line error for cuda
    without CUDA); on CUDA the current device, as :func:`lbsgd.distributed.init` picks it."""
    distributed.check_layout(cfg.device, cfg.backend, 1)
    kind, _ = distributed.resolve(cfg.device, cfg.backend)
    return (
        torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)
    )


def device_slug(device: torch.device) -> str:
    """``cpu``, or ``cuda_`` and the GPU's model: "NVIDIA H100 80GB HBM3" -> ``cuda_h100``,
    "NVIDIA GeForce RTX 4090" -> ``cuda_rtx_4090`` (vendor words dropped, words up to the first
    one holding a digit kept)."""
    if device.type != "cuda":
        return device.type
    words = [
        w
        for w in re.split(r"[^a-z0-9]+", torch.cuda.get_device_name(device).lower())
        if w and w not in ("nvidia", "geforce", "tesla", "quadro")
    ]
    model = next((i for i, w in enumerate(words) if any(c.isdigit() for c in w)), len(words) - 1)
    return "_".join(["cuda", *words[: model + 1]])


def default_out(overrides: list[str], name: str = "train", defaults: dict | None = None) -> str:
    """``results/benchmarks/<name>_<device slug>.json`` for the device these keys (over
    ``defaults``, :data:`DEFAULTS`) run on."""
    cfg = _config(overrides, defaults)[1]
    return f"results/benchmarks/{name}_{device_slug(bench_device(cfg))}.json"


def _timed_warmup(steps: int) -> int:
    # the trainer's rule (lbsgd.trainer): the first steps, always leaving one steady step
    return min(SETTLING_STEPS, steps - 1)


def bare_loop(cfg: Config, splits: data.Splits, steps: int, device: torch.device) -> Timing:
    """Steady images per second of the plain loop over ``steps`` optimizer steps, and its warm-up.

    The reference side deliberately shares none of lbsgd's code paths, so it builds its own
    GradScaler (everywhere else lbsgd.precision is the only place that does).
    """
    torch.manual_seed(cfg.seed)
    model = models.build(cfg, splits.num_classes, splits.image_size).to(device)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model.to(memory_format=fmt).train()
    opt = torch.optim.SGD(
        model.parameters(),
        lr=0.01,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
    )
    net = torch.compile(model) if cfg.compile else model
    dtype = _AUTOCAST[cfg.precision]
    scaler = torch.amp.GradScaler(
        device.type, init_scale=cfg.loss_scale, enabled=cfg.precision == "fp16"
    )
    x_all, y_all = splits.train.tensors  # on the device already when it fits (data.resident)
    mb = micro_batch(cfg)
    accum = cfg.batch_size // mb
    order = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(cfg.seed))
    order = order.to(x_all.device)  # indices where the data are: no host wait per batch
    warm = _timed_warmup(steps)
    distributed.synchronize(device)
    t0 = t_warm = time.perf_counter()
    pos = 0
    for step in range(steps):
        if step == warm and warm:
            distributed.synchronize(device)
            t_warm = time.perf_counter()
        for _ in range(accum):
            if pos + mb > len(order):
                pos = 0
            idx = order[pos : pos + mb]
            pos += mb
            x = x_all[idx].to(device, non_blocking=True, memory_format=fmt)
            y = y_all[idx].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(net(x), y) / accum
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    distributed.synchronize(device)
    t_end = time.perf_counter()
    return Timing((steps - warm) * cfg.batch_size / (t_end - t_warm), t_warm - t0 if warm else None)


def trainer_run(cfg: Config, steps: int, num_train: int, out_dir: str) -> Timing:
    """Images per second of lbsgd's trainer (its own measurement: steady training steps only)."""
    from lbsgd.entry import train

    epochs = steps * cfg.batch_size / num_train
    summary = train(cfg.replace(epochs=epochs, out_dir=out_dir, name=None))
    return timing(summary, steps, "lbsgd bench train")


def timing(summary: dict, steps: int, what: str) -> Timing:
    """The trainer's own measurement in its ``summary``; a run asked to stop (Ctrl-C, SIGTERM)
    an interrupt of the benchmark, one that stopped short (diverged: random labels at a large lr)
    a failure in one line, prefixed ``what``."""
    if summary["status"] == "interrupted":
        raise KeyboardInterrupt(f"the trainer stopped at step {summary['steps']}")
    if summary["steps"] != steps:
        raise RuntimeError(
            f"{what}: the trainer stopped {summary['status']} after "
            f"{summary['steps']} of {steps} steps"
        )
    return Timing(summary["img_per_s"], summary.get("warmup_s"))


def _config(overrides: list[str], defaults: dict | None = None) -> tuple[dict, Config]:
    """The keys given over ``defaults`` (:data:`DEFAULTS`), validated (one-line ConfigError)."""
    values = {**(DEFAULTS if defaults is None else defaults), **config.parse_overrides(overrides)}
    registry.import_plugins(values.get("plugins", ()))
    return values, config.from_dict(values)


def setup(overrides: list[str], defaults: dict | None = None) -> tuple[dict, Config]:
    """:func:`_config` at one micro-batch, and the process-wide settings both sides share."""
    values, cfg = _config(overrides, defaults)
    if cfg.micro_batch == "auto":
        raise ConfigError(
            "micro_batch=auto: lbsgd bench train compares both sides at one micro-batch; give "
            "micro_batch=<a multiple of bn_batch>"
        )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:  # process-wide: set before either side runs, so both run alike
        from lbsgd.entry import deterministic

        deterministic()
    return values, cfg


def prepared(
    overrides: list[str], defaults: dict | None = None
) -> tuple[dict, Config, torch.device, data.Splits, dict]:
    """:func:`setup`, the device, the config's splits there (in memory, else a one-line
    ConfigError) and the environment, recorded before any measurement."""
    values, cfg = setup(overrides, defaults)
    device = bench_device(cfg)
    splits = data.build(cfg, device)
    if not isinstance(splits.train, torch.utils.data.TensorDataset):
        raise ConfigError(f"dataset={cfg.dataset}: the benchmark needs an in-memory dataset")
    return values, cfg, device, splits, {**environment(device, 1), "node": platform.node()}


def alternating(
    sides: dict[str, Callable[[int], Any]], repeats: int, compile: bool, label: str | None = None
) -> dict[str, list]:
    """Each of ``sides`` (called with the repeat's number) ``repeats`` times, the order reversed
    every other repeat so that drifts in load hit every side alike; their results by side. With
    ``label``, each repeat's throughputs (the results' img_per_s) printed after it."""
    runs: dict[str, list] = {name: [] for name in sides}
    for r in range(repeats):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            if compile:  # a fresh model would otherwise count against dynamo's recompile
                torch._dynamo.reset()  # limit and silently run eager after a few measurements
            runs[name].append(sides[name](r))
        if label is not None:
            speeds = "   ".join(f"{name} {v[-1].img_per_s:8.1f} img/s" for name, v in runs.items())
            print(f"{label}repeat {r}: {speeds}", flush=True)
    return runs


def _compare(
    cfg: Config,
    splits: data.Splits,
    steps: int,
    repeats: int,
    device: torch.device,
    tmp: str,
    label: str = "",
) -> dict:
    """Both sides of one configuration, alternating; one row of the result."""
    d = derive(cfg, 1, len(splits.train))
    sides = {
        "bare": lambda r: bare_loop(cfg, splits, steps, device),
        "trainer": lambda r: trainer_run(cfg, steps, d.num_train, f"{tmp}/{r}"),
    }
    runs = alternating(sides, repeats, cfg.compile, label)
    bare, ours = runs["bare"], runs["trainer"]
    b, t = [x.img_per_s for x in bare], [x.img_per_s for x in ours]
    return {
        "batch_size": cfg.batch_size,
        "micro_batch": d.micro_batch,
        "bn_batch": cfg.bn_batch,
        "accum_steps": d.accum_steps,
        "precision": cfg.precision,
        "compile": cfg.compile,
        "bare_img_per_s": max(b),
        "trainer_img_per_s": max(t),
        "ratio": max(t) / max(b),
        "bare_median_img_per_s": statistics.median(b),
        "trainer_median_img_per_s": statistics.median(t),
        "ratio_of_medians": statistics.median(t) / statistics.median(b),
        "all_bare": b,
        "all_trainer": t,
        "bare_warmup_s": [x.warmup_s for x in bare],
        "trainer_warmup_s": [x.warmup_s for x in ours],
    }


def header(cfg: Config, steps: int, repeats: int, device: torch.device, env: dict) -> dict:
    return {
        "model": f"{cfg.model}{cfg.depth}w{cfg.width}" if cfg.model == "resnet" else cfg.model,
        "dataset": cfg.dataset,
        "device": device_slug(device),
        "steps": steps,
        "warmup_steps_excluded": _timed_warmup(steps),
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "channels_last": cfg.channels_last,
        "config": cfg.to_dict(),
        "environment": env,
    }


def write(result: dict, out: str | None) -> None:
    """``result`` as JSON at ``out`` (its folder made, the file replaced whole); nothing where
    ``out`` is None."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with rundir.replacing(out) as tmp:
            tmp.write_text(json.dumps(result, indent=2) + "\n")


def bench_train(
    overrides: list[str], steps: int = 150, repeats: int = 3, out: str | None = None
) -> dict:
    """One configuration (the keys given over :data:`DEFAULTS`); written to ``out`` if given."""
    _, cfg, device, splits, env = prepared(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        row = _compare(cfg, splits, steps, repeats, device, tmp)
    result = {
        "benchmark": "trainer vs bare loop",
        **header(cfg, steps, repeats, device, env),
        **row,
    }
    print(
        f"best of {repeats}: bare loop {result['bare_img_per_s']:.1f} img/s | trainer "
        f"{result['trainer_img_per_s']:.1f} img/s | ratio trainer/bare = {result['ratio']:.3f} "
        f"(ratio of medians {result['ratio_of_medians']:.3f})",
        flush=True,
    )
    write(result, out)
    return result


def parse_list(option: str, text: str | None, valid: tuple[str, ...]) -> list[str]:
    """``"fp32,bf16"`` → ["fp32", "bf16"], each checked against ``valid`` (one-line ConfigError);
    none given: all of ``valid``."""
    if not text:
        return list(valid)
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    for item in items:
        if item not in valid:
            raise ConfigError(f"{option}: {item!r} is not one of {', '.join(valid)}")
    if not items:
        raise ConfigError(f"{option}: give at least one of {', '.join(valid)}")
    return list(dict.fromkeys(items))


def matrix_variants(
    cfg: Config,
    precisions: Sequence[str],
    compiles: Sequence[bool],
    layouts: Sequence[str],
    accum: int,
) -> list[tuple[str, dict]]:
    """(label, keys) per variant: every precision x compile x layout, layouts built from the
    config's micro_batch m and bn_batch n (see the module docstring). ``reference_batch`` follows
    the batch so every variant trains at base_lr (large scaled rates diverge on random labels)."""
    m, n = micro_batch(cfg), cfg.bn_batch
    if "ghost_bn" in layouts and not n < m:
        raise ConfigError(
            f"--layouts ghost_bn needs bn_batch < micro_batch: bn_batch={n}, micro_batch={m} "
            f"(e.g. micro_batch={4 * n})"
        )
    if accum < 2:
        raise ConfigError(f"--accum={accum} must be an integer >= 2 (micro-batches per step)")
    shapes = {"plain": (m, m), "ghost_bn": (m, n), "accum": (accum * m, m)}  # (batch, bn_batch)
    out = []
    for prec, comp, lay in itertools.product(precisions, compiles, layouts):
        batch, bn = shapes[lay]
        label = f"{prec} {'compiled' if comp else 'eager'} {lay}"
        keys = {
            "precision": prec,
            "compile": comp,
            "batch_size": batch,
            "micro_batch": m,
            "bn_batch": bn,
            "reference_batch": batch,
        }
        out.append((label, keys))
    return out


def bench_matrix(
    overrides: list[str],
    precisions: Sequence[str] = PRECISIONS,
    compiles: Sequence[bool] = (False, True),
    layouts: Sequence[str] = LAYOUTS,
    accum: int = 4,
    steps: int = 50,
    repeats: int = 2,
    out: str | None = None,
) -> dict:
    """Trainer vs bare loop for every variant of :func:`matrix_variants`, one line each."""
    values, base, device, splits, env = prepared(overrides)
    variants = matrix_variants(base, precisions, compiles, layouts, accum)
    cfgs = [config.from_dict({**values, **keys}) for _, keys in variants]  # all refused up front
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ((label, keys), cfg) in enumerate(zip(variants, cfgs, strict=True)):
            row = {
                "variant": label,
                "layout": label.rsplit(" ", 1)[1],
                "keys": keys,
                **_compare(cfg, splits, steps, repeats, device, f"{tmp}/{i}", f"{label}: "),
            }
            rows.append(row)
            warm = [w for w in row["trainer_warmup_s"] if w is not None]
            print(
                f"{label:<26} | bare {row['bare_img_per_s']:9.1f} img/s | trainer "
                f"{row['trainer_img_per_s']:9.1f} img/s | trainer/bare {row['ratio']:.3f} "
                f"(medians {row['ratio_of_medians']:.3f}) | trainer warm-up "
                f"{max(warm) if warm else float('nan'):.1f} s",
                flush=True,
            )
    result = {
        "benchmark": "trainer vs bare loop, matrix",
        **header(base, steps, repeats, device, env),
        "rows": rows,
        "ghost_over_plain": ghost_over_plain(rows),
    }
    write(result, out)
    return result


def ghost_over_plain(rows: Sequence[dict]) -> list[dict]:
    """Per precision and compile, the trainer's ghost-BN throughput over its plain-BN one at the
    same micro-batch (both measured in this invocation), printed a line each."""
    by = {(r["precision"], r["compile"], r["layout"]): r for r in rows}
    out = []
    for (prec, comp, lay), ghost in by.items():
        plain = by.get((prec, comp, "plain"))
        if lay != "ghost_bn" or plain is None:
            continue
        ratio = ghost["trainer_img_per_s"] / plain["trainer_img_per_s"]
        out.append({"precision": prec, "compile": comp, "ratio": ratio})
        print(
            f"{prec} {'compiled' if comp else 'eager'}: ghost BN ({ghost['bn_batch']} a group) "
            f"over plain BN, trainer: {ratio:.3f}",
            flush=True,
        )
    return out


# ``lbsgd bench recipes``: what each large-batch recipe costs, every variant against a baseline
# measured in the same process (alternating, best and median of the repeats).
RECIPES: dict[str, list[tuple[str, dict]]] = {
    # same micro-batch m = 32; the global batch takes 1 or 8 micro-batches per optimizer step
    "accumulation": [
        ("batch=m (no accumulation)", {"batch_size": 32, "micro_batch": 32}),
        ("batch=8m (8 accumulated micro-batches)", {"batch_size": 256, "micro_batch": 32}),
    ],
    # same micro-batch of 128; BN over the whole micro-batch vs over 8 ghost groups of 16
    "ghost_bn": [
        ("plain BN (bn_batch=128)", {"batch_size": 128, "micro_batch": 128, "bn_batch": 128}),
        (
            "ghost BN (bn_batch=16, 8 groups)",
            {"batch_size": 128, "micro_batch": 128, "bn_batch": 16},
        ),
    ],
    "precision": [
        ("fp32", {"precision": "fp32"}),
        ("bf16", {"precision": "bf16"}),
        ("fp16 (loss scaling)", {"precision": "fp16"}),
    ],
}


def bench_recipes(
    overrides: list[str], samples: int = 4096, repeats: int = 3, out: str | None = None
) -> dict:
    values, base = _config(overrides, {**DEFAULTS, "bn_batch": 16})
    if base.threads:
        torch.set_num_threads(base.threads)
    device = bench_device(base)
    num_train = len(data.build(base, torch.device("cpu")).train)  # fills the cache, untimed
    env = {**environment(device, 1), "node": platform.node()}
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for study, variants in RECIPES.items():
            cfgs = [config.from_dict({**values, **v}) for _, v in variants]
            runs: list[list[float]] = [[] for _ in variants]
            for r in range(repeats):
                order = range(len(variants)) if r % 2 == 0 else reversed(range(len(variants)))
                for i in order:
                    steps = max(1, samples // cfgs[i].batch_size)
                    run = trainer_run(cfgs[i], steps, num_train, f"{tmp}/{study}{i}_{r}")
                    runs[i].append(run.img_per_s)
            best0, med0 = max(runs[0]), statistics.median(runs[0])
            results[study] = []
            for (label, v), ips in zip(variants, runs, strict=True):
                row = {
                    "variant": label,
                    "keys": v,
                    "best_img_per_s": max(ips),
                    "median_img_per_s": statistics.median(ips),
                    "all_img_per_s": ips,
                    "ratio_best": max(ips) / best0,
                    "ratio_median": statistics.median(ips) / med0,
                }
                results[study].append(row)
                print(
                    f"{study:>12} | {label:<40} {row['best_img_per_s']:8.1f} img/s | "
                    f"vs baseline {row['ratio_best']:.3f} (medians {row['ratio_median']:.3f})",
                    flush=True,
                )
    result = {
        "benchmark": "large-batch recipes, trainer throughput vs a baseline variant",
        "samples_per_measurement": samples,
        "repeats": repeats,
        "base_config": base.to_dict(),
        "results": results,
        "environment": env,
    }
    write(result, out)
    return result
