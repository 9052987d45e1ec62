"""Loaders for the two real datasets of the study, CIFAR-10 and ImageNet, read from ``data_dir``.

Nothing here downloads: the machines this runs on may have no internet, so a missing or malformed
``data_dir`` is a ``FileNotFoundError`` that says which layout was expected and how to get it.
CIFAR-10 (torchvision's python layout) is read once into uint8 tensors and augmented on the
training device (:mod:`lbsgd.data.device_images`); ImageNet (ImageFolder layout) is decoded and
augmented per sample as in Goyal et al. 2017 §5.1."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from lbsgd.data.device_images import DeviceImages
from lbsgd.data.prefetch import Normalise

# Per-channel mean/std over all pixels of the 50,000 CIFAR-10 training images, pixels scaled to
# [0, 1] (recompute: CIFAR10(root).data.reshape(-1, 3).mean(0) / 255, likewise .std(0)). The
# often-copied std (0.2023, 0.1994, 0.2010) is not this pixel std, so it is not used here.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

# The ImageNet-1k training-set statistics used by torchvision's pretrained models and reference
# scripts and by fb.resnet.torch, whose per-colour mean/std normalisation Goyal et al. §5.1 follow.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_CIFAR_FOLDER = "cifar-10-batches-py"
_CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
_CIFAR_HOWTO = (
    "expected torchvision's CIFAR-10 python version; download it with "
    "torchvision.datasets.CIFAR10(root, download=True) on a machine with internet"
)
_IMAGENET_HOWTO = (
    "expected ImageFolder layout train/<class>/<image> and val/<class>/<image> with the same class "
    "folders in both; ILSVRC-2012 val images must first be sorted into class folders"
)


def _missing(data_dir: Path, problem: str, expected: str) -> FileNotFoundError:
    return FileNotFoundError(f"data_dir='{data_dir}' {problem} ({expected})")


def _cifar10_folder(data_dir: str | os.PathLike) -> Path:
    """The batches folder of a CIFAR-10 data_dir (itself, or its cifar-10-batches-py/);
    FileNotFoundError if it holds none."""
    data_dir = Path(data_dir).expanduser()
    if not data_dir.is_dir():
        raise _missing(data_dir, "does not exist or is not a directory", _CIFAR_HOWTO)
    if (data_dir / _CIFAR_FOLDER).is_dir():
        folder = data_dir / _CIFAR_FOLDER
    elif (data_dir / "batches.meta").is_file():  # data_dir is the batches folder itself
        folder = data_dir
    else:
        raise _missing(data_dir, f"has no {_CIFAR_FOLDER}/", _CIFAR_HOWTO)
    absent = [name for name in _CIFAR_FILES if not (folder / name).is_file()]
    if absent:
        raise _missing(data_dir, f"lacks {folder.name}/{{{','.join(absent)}}}", _CIFAR_HOWTO)
    return folder


def _read_split(folder: Path, names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (N, 3, 32, 32) images and int64 labels of the batch files ``names``, in order: each
    row of a file's "data" is 1024 red, then green, then blue pixels, each plane row-major."""
    images, labels = [], []
    for name in names:
        with open(folder / name, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        pixels = np.asarray(entry["data"], dtype=np.uint8)
        if pixels.ndim != 2 or pixels.shape[1] != 3072 or len(pixels) != len(entry["labels"]):
            raise ValueError(
                f"{folder / name}: expected one 3072-byte row per label, got data of "
                f"shape {pixels.shape} and {len(entry['labels'])} labels"
            )
        images.append(pixels.reshape(-1, 3, 32, 32))
        labels.extend(entry["labels"])
    return torch.from_numpy(np.concatenate(images)), torch.tensor(labels, dtype=torch.int64)


def cifar10(
    data_dir: str | os.PathLike, augment: bool = True
) -> tuple[DeviceImages, DeviceImages, int, int]:
    """Return ``(train, test, num_classes=10, image_size=32)`` for CIFAR-10 under ``data_dir``.

    ``data_dir`` is either the folder holding ``cifar-10-batches-py/`` (torchvision's ``root``) or
    that batches folder itself. Both splits are read once into uint8 tensors
    (:class:`~lbsgd.data.device_images.DeviceImages`), normalised per batch on the training device;
    the train split is pad-crop-flip augmented there, unless ``augment=False``.
    """
    folder = _cifar10_folder(data_dir)
    with open(folder / "batches.meta", "rb") as f:
        classes = list(pickle.load(f, encoding="latin1")["label_names"])
    x_tr, y_tr = _read_split(folder, [f"data_batch_{i}" for i in range(1, 6)])
    x_te, y_te = _read_split(folder, ["test_batch"])
    train = DeviceImages(x_tr, y_tr, CIFAR10_MEAN, CIFAR10_STD, augment, classes)
    test = DeviceImages(x_te, y_te, CIFAR10_MEAN, CIFAR10_STD, False, classes)
    return train, test, 10, 32


def _class_folders(split_dir: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


def _imagenet_classes(data_dir: Path) -> list[str]:
    """The class folders of an ImageFolder data_dir (train/ and val/ alike); FileNotFoundError if
    the layout is not that."""
    data_dir = Path(data_dir).expanduser()
    if not data_dir.is_dir():
        raise _missing(data_dir, "does not exist or is not a directory", _IMAGENET_HOWTO)
    for split in ("train", "val"):
        if not (data_dir / split).is_dir() or not _class_folders(data_dir / split):
            raise _missing(data_dir, f"has no class folders under {split}/", _IMAGENET_HOWTO)
    train_classes = _class_folders(data_dir / "train")
    val_classes = _class_folders(data_dir / "val")
    if train_classes != val_classes:
        # Labels are positions in the sorted folder list, so any difference would silently
        # mislabel val images; name both sides of the mismatch.
        only_train = sorted(set(train_classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(train_classes))
        raise _missing(
            data_dir,
            f"has different class folders in {data_dir / 'train'} ({len(train_classes)}) and "
            f"{data_dir / 'val'} ({len(val_classes)}): only in train: {only_train[:5]}, "
            f"only in val: {only_val[:5]}",
            _IMAGENET_HOWTO,
        )
    return train_classes


def check(dataset: str, data_dir: str | os.PathLike) -> None:
    """The layout checks of ``dataset``'s builder, without reading any image (before any work)."""
    if dataset == "cifar10":
        _cifar10_folder(data_dir)
    elif dataset == "imagenet":
        _imagenet_classes(Path(data_dir).expanduser())


def imagenet(
    data_dir: str | os.PathLike, image_size: int = 224
) -> tuple[Dataset, Dataset, int, int]:
    """Return ``(train, val, num_classes, image_size)`` for an ImageFolder tree under ``data_dir``.

    Labels are the indices of the sorted class-folder names, identical for train and val. Items
    are uint8 CHW crops (decoded, cropped, resized and flipped by PIL in the loader workers, no
    float work on the CPU); each split's ``on_device`` (:class:`~lbsgd.data.prefetch.Normalise`
    with the ImageNet statistics) turns a collated batch into normalised float32 where it trains,
    which :func:`lbsgd.data.batches` does.
    """
    # torchvision is imported here, not with the module: importing it costs 1-2 s of CPU, which
    # a process that reads no ImageNet folder (a notebook's kernel, lbsgd report) need not pay
    from torchvision import transforms

    from lbsgd.data.image_folder import UInt8ImageFolder

    data_dir = Path(data_dir).expanduser()
    train_classes = _imagenet_classes(data_dir)
    to_uint8 = [transforms.PILToTensor()]  # HWC PIL -> uint8 CHW, no scaling
    # fb.resnet.torch, whose recipe Goyal et al. follow, also applies colour augmentation (colour
    # jitter plus AlexNet-style PCA lighting). It is left out: it is expected to be a small effect
    # on final error, it is the same at every minibatch size so it does not change the comparisons
    # this study replays, and per-image colour work costs CPU that the data loader can rarely
    # spare. Absolute top-1 may therefore come out slightly worse than the paper's.
    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
            transforms.RandomHorizontalFlip(),
            *to_uint8,
        ]
    )
    val_tf = transforms.Compose(
        [
            transforms.Resize(int(image_size * 256 / 224)),  # 256 for 224, the usual ratio
            transforms.CenterCrop(image_size),
            *to_uint8,
        ]
    )
    on_device = Normalise(IMAGENET_MEAN, IMAGENET_STD)
    train = UInt8ImageFolder(data_dir / "train", train_tf, on_device, eval_transform=val_tf)
    val = UInt8ImageFolder(data_dir / "val", val_tf, on_device)
    return train, val, len(train_classes), image_size
