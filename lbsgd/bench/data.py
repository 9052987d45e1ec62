"""``lbsgd bench data``: does the data loader or the model bound training, and by how much?

Two numbers from one invocation on the run's device: the **loader**'s images per second
(:func:`lbsgd.data.batches` over a real dataset, with the trainer's augmentation, up to normalised
batches on the device; its first batch timed apart as ``loader_startup_s``), and the model's own
**compute**-bound speed on device-resident data of the same shape. Training runs at about the
smaller; the ratio loader/compute says which bounds it (below 1: the loader, by that factor)."""

from __future__ import annotations

import itertools
import platform
import time

import torch

from lbsgd import data, distributed, seeding
from lbsgd.bench import train as bench
from lbsgd.config import ConfigError, micro_batch
from lbsgd.data import folders
from lbsgd.environment import environment

DATASETS = {"cifar10": folders.cifar10, "imagenet": folders.imagenet}  # imagenet: 224x224 crops


def _real_train(dataset: str, data_dir: str):
    """(train split, image size, classes) of a file dataset; a one-line ConfigError if absent."""
    if dataset not in DATASETS:
        raise ConfigError(f"--dataset={dataset!r} is not one of {', '.join(DATASETS)}")
    try:
        train, _, classes, size = DATASETS[dataset](data_dir)
    except FileNotFoundError as e:
        raise ConfigError(f"--data-dir: {e}") from None
    return train, size, classes


def loader_rate(
    train, batch: int, batches: int, workers: int, seed: int, device: torch.device
) -> tuple[float, float]:
    """(steady images/s after the first batch, seconds to the first batch) of ``batches`` batches
    of ``batch`` samples, drawn in a seeded random order (cycled when longer than the split)."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    idx = torch.cat([order] * -(-batches * batch // len(order)))[: batches * batch]
    positions = torch.arange(len(idx))
    stream = data.batches(
        train,
        idx.split(batch),
        workers,
        seeds=seeding.augmentation(seed, positions).split(batch),
        device=device,
    )
    t0 = time.perf_counter()
    next(stream)
    distributed.synchronize(device)
    t1 = time.perf_counter()
    rest = sum(len(y) for _, y in itertools.islice(stream, batches - 1))
    distributed.synchronize(device)
    return rest / (time.perf_counter() - t1), t1 - t0


def bench_data(
    dataset: str,
    data_dir: str,
    workers: int,
    batches: int,
    steps: int,
    overrides: list[str],
    out: str | None = None,
) -> dict:
    """Loader vs compute (module docstring); written to ``out`` as JSON when given."""
    for option, value in (("--batches", batches), ("--steps", steps)):
        if value < 2:
            raise ConfigError(f"{option}={value} must be at least 2 (the first is timed apart)")
    if workers < 0:
        raise ConfigError(f"--workers={workers} must be 0 (main process) or more")
    train, size, classes = _real_train(dataset, data_dir)
    _, cfg = bench.setup(
        [*overrides, "dataset=fake", f"fake_image_size={size}", f"fake_classes={classes}"]
    )
    device = bench.bench_device(cfg)
    env = {**environment(device, 1), "node": platform.node()}
    mb = micro_batch(cfg)
    loader, startup = loader_rate(train, mb, batches, workers, cfg.seed, device)
    print(
        f"loader  {dataset} workers={workers} batch={mb}: {loader:9.1f} img/s "
        f"(first batch {startup:.2f} s)",
        flush=True,
    )
    splits = data.build(cfg, device)
    compute = bench.bare_loop(cfg, splits, steps, device)
    print(
        f"compute {bench.header(cfg, steps, 1, device, env)['model']} {cfg.precision} on "
        f"{size}x{size}, {classes} classes: {compute.img_per_s:9.1f} img/s",
        flush=True,
    )
    ratio = loader / compute.img_per_s
    if ratio < 1:
        bound, by = "loader", f"at ~{ratio:.2f}x of the model's speed"
    else:
        bound, by = "compute", f"the loader has {ratio:.2f}x headroom"
    print(f"loader/compute = {ratio:.2f}: training is {bound}-bound ({by})", flush=True)
    result = {
        "benchmark": "data loader vs compute",
        "dataset": dataset,
        "data_dir": str(data_dir),
        "workers": workers,
        "decoder": "pil",  # nvJPEG decoding is not implemented (docs/datasets.md)
        "micro_batch": mb,
        "image_size": size,
        "num_classes": classes,
        "loader_batches": batches,
        "loader_img_per_s": loader,
        "loader_startup_s": startup,
        "compute_steps": steps,
        "compute_img_per_s": compute.img_per_s,
        "compute_warmup_s": compute.warmup_s,
        "loader_over_compute": ratio,
        "bound": bound,
        **{k: v for k, v in bench.header(cfg, steps, 1, device, env).items() if k != "dataset"},
    }
    bench.write(result, out)
    return result
