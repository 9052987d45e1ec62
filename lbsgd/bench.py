"""``lbsgd bench train``: the trainer against a minimal hand-written PyTorch loop, same everything.

Both sides train the same model (same initialisation), on the same in-memory data, with the same
batch, micro-batch, optimizer and thread count, for the same number of optimizer steps. The bare
loop is what a PyTorch tutorial writes: index a batch, forward, loss, backward, SGD step. The
trainer adds the schedule, the sampler, gradient accumulation bookkeeping, metric flushes and the
run directory. The sides alternate (bare then trainer, trainer then bare, …) so that machine load drifts
hit both; each side's best throughput is compared (ratio = trainer / bare), and the ratio of the
medians is printed beside it.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lbsgd import config, data, models
from lbsgd.config import Config, derive, micro_batch
from lbsgd.environment import environment

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


def bare_loop(cfg: Config, splits: data.Splits, steps: int) -> float:
    """Images per second of the plain loop over ``steps`` optimizer steps."""
    torch.manual_seed(cfg.seed)
    model = models.build(cfg, splits.num_classes, splits.image_size)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model.to(memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=cfg.momentum,
                          nesterov=cfg.nesterov, weight_decay=cfg.weight_decay)  # fmt: skip
    x_all, y_all = splits.train.tensors
    mb = micro_batch(cfg)
    accum = cfg.batch_size // mb
    order = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(cfg.seed))
    t0 = time.perf_counter()
    pos = 0
    for _ in range(steps):
        for _ in range(accum):
            if pos + mb > len(order):
                pos = 0
            idx = order[pos : pos + mb]
            pos += mb
            x = x_all[idx].contiguous(memory_format=fmt)
            loss = torch.nn.functional.cross_entropy(model(x), y_all[idx]) / accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * cfg.batch_size / (time.perf_counter() - t0)


def trainer_run(cfg: Config, steps: int, num_train: int, out_dir: str) -> float:
    """Images per second of lbsgd's trainer (its own measurement: training steps only)."""
    from lbsgd.trainer import train

    epochs = steps * cfg.batch_size / num_train
    summary = train(cfg.replace(epochs=epochs, out_dir=out_dir, name=None))
    assert summary["steps"] == steps, summary["steps"]
    return summary["img_per_s"]


def bench_train(
    overrides: list[str], steps: int = 150, repeats: int = 3, out: str | None = None
) -> dict:
    values = {**DEFAULTS, **config.parse_overrides(overrides)}
    config.import_plugins(values.get("plugins", ()))
    cfg = config.from_dict(values)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    splits = data.build(cfg)
    if not isinstance(splits.train, torch.utils.data.TensorDataset):
        raise config.ConfigError(f"dataset={cfg.dataset}: the benchmark needs an in-memory dataset")
    d = derive(cfg, 1, len(splits.train))
    env = {**environment(torch.device("cpu"), 1), "node": platform.node()}  # before, not after
    bare, ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):  # alternate which side goes first: drifts in load hit both
            sides = [lambda: bare.append(bare_loop(cfg, splits, steps)),
                     lambda r=r: ours.append(trainer_run(cfg, steps, d.num_train, f"{tmp}/{r}"))]  # fmt: skip
            for run in sides if r % 2 == 0 else sides[::-1]:
                run()
            print(
                f"repeat {r}: bare {bare[-1]:8.1f} img/s   trainer {ours[-1]:8.1f} img/s",
                flush=True,
            )
    result = {
        "benchmark": "trainer vs bare loop",
        "model": f"{cfg.model}{cfg.depth}w{cfg.width}" if cfg.model == "resnet" else cfg.model,
        "batch_size": cfg.batch_size,
        "micro_batch": d.micro_batch,
        "steps": steps,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "channels_last": cfg.channels_last,
        "bare_img_per_s": max(bare),
        "trainer_img_per_s": max(ours),
        "ratio": max(ours) / max(bare),
        "bare_median_img_per_s": statistics.median(bare),
        "trainer_median_img_per_s": statistics.median(ours),
        "ratio_of_medians": statistics.median(ours) / statistics.median(bare),
        "all_bare": bare,
        "all_trainer": ours,
        "config": cfg.to_dict(),
        "environment": env,
    }
    print(
        f"best of {repeats}: bare loop {result['bare_img_per_s']:.1f} img/s | trainer "
        f"{result['trainer_img_per_s']:.1f} img/s | ratio trainer/bare = {result['ratio']:.3f} "
        f"(ratio of medians {result['ratio_of_medians']:.3f})",
        flush=True,
    )
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


# ``lbsgd bench recipes``: what each large-batch recipe costs, every variant against a baseline
# measured in the same process (alternating, best and median of the repeats).
RECIPES: dict[str, list[tuple[str, dict]]] = {
    # same micro-batch m = 32; the global batch takes 1 or 8 micro-batches per optimizer step
    "accumulation": [("batch=m (no accumulation)", {"batch_size": 32, "micro_batch": 32}),
                     ("batch=8m (8 accumulated micro-batches)", {"batch_size": 256, "micro_batch": 32})],
    # same micro-batch of 128; BN over the whole micro-batch vs over 8 ghost groups of 16
    "ghost_bn": [("plain BN (bn_batch=128)", {"batch_size": 128, "micro_batch": 128, "bn_batch": 128}),
                 ("ghost BN (bn_batch=16, 8 groups)", {"batch_size": 128, "micro_batch": 128, "bn_batch": 16})],
    "precision": [("fp32", {"precision": "fp32"}), ("bf16", {"precision": "bf16"}),
                  ("fp16 (loss scaling)", {"precision": "fp16"})],
}  # fmt: skip


def bench_recipes(
    overrides: list[str], samples: int = 4096, repeats: int = 3, out: str | None = None
) -> dict:
    values = {**DEFAULTS, "bn_batch": 16, **config.parse_overrides(overrides)}
    config.import_plugins(values.get("plugins", ()))
    base = config.from_dict(values)
    if base.threads:
        torch.set_num_threads(base.threads)
    num_train = len(data.build(base).train)  # fills the cache before anything is timed
    env = {**environment(torch.device("cpu"), 1), "node": platform.node()}
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for study, variants in RECIPES.items():
            cfgs = [config.from_dict({**values, **v}) for _, v in variants]
            runs: list[list[float]] = [[] for _ in variants]
            for r in range(repeats):
                order = range(len(variants)) if r % 2 == 0 else reversed(range(len(variants)))
                for i in order:
                    steps = max(1, samples // cfgs[i].batch_size)
                    runs[i].append(trainer_run(cfgs[i], steps, num_train, f"{tmp}/{study}{i}_{r}"))
            best0, med0 = max(runs[0]), statistics.median(runs[0])
            results[study] = []
            for (label, v), ips in zip(variants, runs, strict=True):
                row = {"variant": label, "keys": v, "best_img_per_s": max(ips),
                       "median_img_per_s": statistics.median(ips), "all_img_per_s": ips,
                       "ratio_best": max(ips) / best0, "ratio_median": statistics.median(ips) / med0}  # fmt: skip
                results[study].append(row)
                print(f"{study:>12} | {label:<40} {row['best_img_per_s']:8.1f} img/s | "
                      f"vs baseline {row['ratio_best']:.3f} (medians {row['ratio_median']:.3f})",
                      flush=True)  # fmt: skip
    result = {
        "benchmark": "large-batch recipes, trainer throughput vs a baseline variant",
        "samples_per_measurement": samples,
        "repeats": repeats,
        "base_config": base.to_dict(),
        "results": results,
        "environment": env,
    }
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result
