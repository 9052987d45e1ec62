"""Datasets by name, and the batches each process trains on.

A builder (:func:`register_dataset`) gets the run's config and returns :class:`Splits` of
map-style datasets yielding ``(image CHW float tensor, int label)``; the built-in ones are listed
in docs/datasets.md. In-memory ``TensorDataset`` splits are moved to the run's device once when
they fit and batched by indexing (:func:`batches`), so the trainer's ``x.to(device)`` is a no-op;
any other dataset goes through a ``DataLoader`` with ``workers`` processes. ``holdout`` > 0 carves
the same validation images from the train split for every run (:func:`hold_out`), seen as an
evaluation sees them."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from lbsgd import distributed
from lbsgd.config import ConfigError
from lbsgd.data import fake, fashion_mnist, folders, prefetch, synthetic
from lbsgd.data.device_images import DeviceImages
from lbsgd.data.sampler import StepSampler
from lbsgd.registry import Registry
from lbsgd.seeding import held_out, sample_seeds


@dataclass(frozen=True)
class Splits:
    train: Dataset
    test: Dataset
    num_classes: int
    image_size: int
    val: Dataset | None = None  # held out of the train split (``holdout``; :func:`hold_out`)


DATASETS: Registry[Callable[..., Splits]] = Registry("dataset")
register_dataset = DATASETS.register


def check(cfg) -> None:
    """What can be checked of the dataset before any work starts: the layout of a file dataset's
    data_dir (one-line ConfigError naming data_dir and what is expected there); Fashion-MNIST's
    files are read and digested whole (~0.5 s)."""
    if cfg.dataset not in DATASETS:
        raise ConfigError(DATASETS.unknown_message(cfg.dataset))
    try:
        if cfg.dataset == "fashion_mnist":
            fashion_mnist.check(cfg.data_dir)
        folders.check(cfg.dataset, cfg.data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None


# (classes, image size) of the built-in in-memory datasets, known before anything is generated
SYNTHETIC_SHAPE = (10, 16)


def memory_need(cfg) -> tuple[int, tuple[str, ...]]:
    """Bytes the train and test splits of a generated in-memory dataset take (float32 CHW, as
    built; Fashion-MNIST's: uint8, one channel), and the keys that set them; (0, ()) for file
    datasets and plugins."""
    if cfg.dataset == "synthetic":
        n, size = cfg.synthetic_train + cfg.synthetic_test, SYNTHETIC_SHAPE[1]
        return n * 3 * size * size * 4, ("synthetic_train", "synthetic_test")
    if cfg.dataset == "fake":
        n, size = cfg.fake_train + cfg.fake_test, cfg.fake_image_size
        return n * 3 * size * size * 4, ("fake_train", "fake_test", "fake_image_size")
    if cfg.dataset == "fashion_mnist":
        n, size = cfg.fashion_train + 10_000, cfg.fashion_size
        return n * size * size, ("fashion_train", "fashion_size")
    return 0, ()


def shape_of(cfg) -> tuple[int, int] | None:
    """(classes, image size) of a built-in dataset before it is read; None for a plugin's."""
    return {
        "synthetic": SYNTHETIC_SHAPE,
        "fake": (cfg.fake_classes, cfg.fake_image_size),
        "cifar10": (10, 32),
        "fashion_mnist": (len(fashion_mnist.CLASSES), cfg.fashion_size),
        "imagenet": (1000, 224),
    }.get(cfg.dataset)


def train_size(cfg) -> int:
    """The training images a run of ``cfg`` steps over (its ``holdout`` taken out): from the keys
    for the generated and Fashion-MNIST datasets, else by building the splits on the host."""
    known = {
        "synthetic": cfg.synthetic_train,
        "fake": cfg.fake_train,
        "fashion_mnist": cfg.fashion_train,
    }.get(cfg.dataset)
    if known is None:
        return len(build(cfg, torch.device("cpu")).train)
    return known - cfg.holdout


# In-memory splits move to a GPU only when together they take at most this share of its free
# memory: the rest is for the model, its activations and the optimizer state (ResNet-50 at
# micro-batch 256 in bf16 needs ~25 GB), and for other processes sharing the GPU (each holds its
# own copy). Larger ones stay on the host and are copied per micro-batch.
RESIDENT_SHARE = 0.25


def build(cfg, device: torch.device | None = None) -> Splits:
    """The splits of ``cfg.dataset``, in-memory ones made resident on ``device`` (:func:`resident`).

    ``device`` defaults to the run's: ``cfg.device`` resolved (auto: cuda when available), on CUDA
    the current device, which :func:`lbsgd.distributed.init` sets per process. Pass
    ``torch.device("cpu")`` to keep everything on the host.
    """
    splits = hold_out(DATASETS.get(cfg.dataset)(cfg), cfg.holdout, cfg.dataset)
    if device is None:
        kind, _ = distributed.resolve(cfg.device, cfg.backend)
        device = torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else None
    return resident(splits, device) if device is not None else splits


def resident(splits: Splits, device: torch.device) -> Splits:
    """``splits`` with its in-memory splits (TensorDataset, :class:`DeviceImages`) copied to
    ``device`` once, when they fit (:data:`RESIDENT_SHARE` of a GPU's free memory); other splits,
    and a host device, unchanged."""
    if device.type == "cpu":
        return splits
    size = _in_memory_bytes([splits.train, splits.test, splits.val])
    if device.type == "cuda" and size > RESIDENT_SHARE * torch.cuda.mem_get_info(device)[0]:
        return splits

    def move(ds: Dataset) -> Dataset:
        if isinstance(ds, DeviceImages):
            return ds.to(device)
        if not isinstance(ds, TensorDataset):
            return ds
        return TensorDataset(*(t.to(device) for t in ds.tensors))

    val = None if splits.val is None else move(splits.val)
    return dataclasses.replace(splits, train=move(splits.train), test=move(splits.test), val=val)


def _in_memory_bytes(splits: list[Dataset | None]) -> int:
    """The bytes of the in-memory splits (TensorDataset, :class:`DeviceImages`) of ``splits``."""
    held = [ds for ds in splits if ds is not None]
    tensors = [t for ds in held if isinstance(ds, TensorDataset) for t in ds.tensors]
    size = sum(t.numel() * t.element_size() for t in tensors)
    return size + sum(ds.nbytes for ds in held if isinstance(ds, DeviceImages))


def holdout_indices(num_train: int, holdout: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out indices, sorted; the other indices, in their order) of a train split of
    ``num_train`` samples: the held-out ones are the first ``holdout`` of one fixed permutation
    (seeded by :func:`lbsgd.seeding.held_out`, not the run's seed), so every run of a dataset holds
    out the same samples, and a larger ``holdout`` holds out those of a smaller one and more."""
    g = torch.Generator().manual_seed(held_out())
    val = torch.randperm(num_train, generator=g)[:holdout].sort().values
    kept = torch.ones(num_train, dtype=torch.bool)
    kept[val] = False
    return val, kept.nonzero().squeeze(1)


def hold_out(splits: Splits, holdout: int, dataset: str = "the dataset") -> Splits:
    """``splits`` with ``holdout`` samples of its train split held out as ``val``
    (:func:`holdout_indices`), seen as an evaluation sees them (the train split's
    ``for_evaluation()`` where it has one); ``train`` keeps the rest, treated as before. An
    in-memory split stays one (its tensors indexed); any other is a ``Subset``. 0: ``splits``
    unchanged. A ConfigError naming ``holdout`` (``dataset``'s train split named) when it leaves
    nothing to train on."""
    if not holdout:
        return splits
    num_train = len(splits.train)  # type: ignore[arg-type]
    if holdout >= num_train:
        raise ConfigError(
            f"holdout={holdout} must be less than the train split's size, {dataset}'s "
            f"{num_train:,} training images (valid: 0 to {num_train - 1}; 0 = no held-out split)"
        )
    val_idx, train_idx = holdout_indices(num_train, holdout)
    evaluated = getattr(splits.train, "for_evaluation", None)
    seen = evaluated() if evaluated is not None else splits.train
    return dataclasses.replace(
        splits, train=_part(splits.train, train_idx), val=_part(seen, val_idx)
    )


def _part(ds: Dataset, idx: torch.Tensor) -> Dataset:
    """The samples ``idx`` of ``ds``: an in-memory split's copied, another's a ``Subset`` that
    keeps its batch-level work (``on_device``: :func:`batches`)."""
    if isinstance(ds, DeviceImages):
        return ds.subset(idx)
    if isinstance(ds, TensorDataset):
        return TensorDataset(*(t[idx.to(t.device)] for t in ds.tensors))
    part = Subset(ds, idx.tolist())
    finish = getattr(ds, "on_device", None)
    if finish is not None:
        part.on_device = finish  # type: ignore[attr-defined]
    return part


@register_dataset("synthetic")
def _synthetic(cfg) -> Splits:
    x_tr, y_tr, x_te, y_te = synthetic.load(
        cfg.synthetic_train,
        cfg.synthetic_test,
        cfg.synthetic_difficulty,
        cfg.synthetic_noise,
        cache_dir=cfg.data_dir or None,
    )
    return Splits(TensorDataset(x_tr, y_tr), TensorDataset(x_te, y_te), *SYNTHETIC_SHAPE)


@register_dataset("fake")
def _fake(cfg) -> Splits:
    size, classes = cfg.fake_image_size, cfg.fake_classes
    x_tr, y_tr, x_te, y_te = fake.splits(cfg.fake_train, cfg.fake_test, size, classes, cfg.seed)
    return Splits(TensorDataset(x_tr, y_tr), TensorDataset(x_te, y_te), classes, size)


@register_dataset("cifar10")
def _cifar10(cfg) -> Splits:
    return Splits(*folders.cifar10(cfg.data_dir))


@register_dataset("fashion_mnist")
def _fashion_mnist(cfg) -> Splits:
    return Splits(
        *fashion_mnist.fashion_mnist(cfg.data_dir, size=cfg.fashion_size, train=cfg.fashion_train)
    )


@register_dataset("imagenet")
def _imagenet(cfg) -> Splits:
    return Splits(*folders.imagenet(cfg.data_dir))


def batches(
    dataset: Dataset,
    index_batches: Iterable[torch.Tensor],
    workers: int = 0,
    pin: bool = False,
    seeds: Iterable[torch.Tensor] | None = None,
    device: torch.device | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) for each index tensor in ``index_batches``, in order.

    ``device``: the training device, where batch-level work (augmentation, normalisation of
    compact uint8 images) happens for datasets that do it there; None = where the data lives.

    ``seeds`` (one tensor per index tensor, e.g. :func:`lbsgd.seeding.augmentation` of the sampler's stream
    positions) makes random augmentation reproducible: each sample's transform draws from torch's
    generator seeded with its own seed, so a sample at a given place of the run's stream is
    augmented the same way whatever the number of processes or loader workers, and after a resume.

    ``pin`` (page-locked batches, for asynchronous copies to a GPU) applies to loader batches only:
    an in-memory split is indexed where it lives, and one already on the GPU (:func:`resident`)
    is never pinned or copied; its index tensors follow it without a host wait.

    Loader batches (file datasets) go to ``device`` when it is given, pinned (on CUDA) and one
    batch ahead on a side stream (:func:`lbsgd.data.prefetch.to_device`); a dataset with an
    ``on_device`` callable (ImageNet: uint8 items) has it applied to each batch there.

    :class:`DeviceImages` (CIFAR-10, Fashion-MNIST) are batched by indexing too, then augmented with ``seeds`` and
    normalised on ``device`` (:meth:`DeviceImages.batch`); ``workers`` and ``pin`` do not apply.
    """
    if isinstance(dataset, DeviceImages):
        seed_batches = seeds if seeds is not None else itertools.repeat(None)
        pairs = zip(index_batches, seed_batches, strict=seeds is not None)
        return (dataset.batch(idx, s, device) for idx, s in pairs)
    if isinstance(dataset, TensorDataset):  # indexed where it lives
        x, y = dataset.tensors
        # a blocking copy would wait for all queued GPU work (a host sync per micro-batch)
        moved = (
            i.to(x.device, non_blocking=True) if isinstance(i, torch.Tensor) else i
            for i in index_batches
        )
        return ((x[idx], y[idx]) for idx in moved)
    return _loader_batches(dataset, index_batches, workers, pin, seeds, device)


def _loader_batches(
    dataset: Dataset,
    index_batches: Iterable[torch.Tensor],
    workers: int,
    pin: bool,
    seeds: Iterable[torch.Tensor] | None,
    device: torch.device | None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A file dataset's batches through a DataLoader, to ``device`` one batch ahead."""
    # A file dataset's batch-level work (ImageNet: uint8 -> normalised float32) runs on `device`,
    # after the copy; the next batch is copied and finished while the current one trains.
    finish = getattr(dataset, "on_device", None)
    if seeds is not None:
        dataset = _Seeded(dataset)
        index_batches = (
            list(zip(idx.tolist(), s.tolist(), strict=True))
            for idx, s in zip(index_batches, seeds, strict=True)
        )
    loader = DataLoader(
        dataset,
        # lazy: a run's index stream can be huge
        batch_sampler=(i if isinstance(i, list) else i.tolist() for i in index_batches),
        num_workers=workers,
        pin_memory=pin or (device is not None and device.type == "cuda"),
        # iterated once: the training stream's workers live for the whole run without this
        persistent_workers=False,
    )
    return prefetch.to_device(loader, device, finish)


class _Seeded(Dataset):
    """Items ``(index, seed)``: the sample ``index`` with torch's generator seeded by ``seed`` (and
    the caller's generator state restored afterwards)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]):
        index, seed = key
        with torch.random.fork_rng(devices=[]):
            # the CPU generator alone: torch.manual_seed also queues a seed, with a captured
            # traceback, for every other device type, per sample
            torch.default_generator.manual_seed(seed)
            return self.dataset[index]


def shard(num_samples: int, rank: int, world_size: int) -> range:
    """Rank ``rank``'s contiguous share of an evaluation split; the shares cover it exactly once."""
    lo = num_samples * rank // world_size
    hi = num_samples * (rank + 1) // world_size
    return range(lo, hi)


__all__ = [
    "DATASETS",
    "DeviceImages",
    "Splits",
    "StepSampler",
    "batches",
    "build",
    "check",
    "hold_out",
    "holdout_indices",
    "register_dataset",
    "resident",
    "sample_seeds",
    "shard",
]
