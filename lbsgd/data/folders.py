"""Loaders for the two real datasets of the study, read from a local ``data_dir``.

Nothing here downloads: the machines this runs on may have no internet, so a missing or malformed
``data_dir`` is a ``FileNotFoundError`` that says which layout was expected and how to get it.

* CIFAR-10 (Krizhevsky 2009) in torchvision's "python version" layout
  (``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``), read by
  ``torchvision.datasets.CIFAR10``. Train augmentation is the usual one of He et al. 2016 §4.2
  (4-pixel zero padding, random 32x32 crop, horizontal flip).
* ImageNet (ILSVRC-2012) in ``torchvision.datasets.ImageFolder`` layout (``train/<class>/*`` and
  ``val/<class>/*``). Train augmentation follows Goyal et al. 2017 §5.1: the scale and aspect-ratio
  augmentation of Szegedy et al. 2015 (GoogLeNet) plus horizontal flip; evaluation is the usual
  resize of the shorter side to 256/224 of the crop, then a centre crop.

Every dataset returns ``(float32 CHW tensor, int label)``.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import Dataset
from torchvision import datasets, transforms

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


class _CIFAR10Files(datasets.CIFAR10):
    """``torchvision.datasets.CIFAR10`` whose integrity check is "all expected files exist".

    torchvision compares the md5 of each batch file against the official archive, which cannot be
    satisfied by the tiny files the tests write, and hashing ~180 MB on every construction buys
    little: a truncated or foreign batch still fails loudly when torchvision reshapes it to
    (N, 3, 32, 32). ``cifar10`` checks the files itself first, so this only ever sees a full folder.
    """

    meta = {**datasets.CIFAR10.meta, "md5": None}  # md5=None: check_integrity tests existence only

    def __init__(self, root: Path, base_folder: str, train: bool, transform: transforms.Compose):
        self.base_folder = base_folder  # lets data_dir be the batches folder itself, under any name
        super().__init__(root, train=train, transform=transform, download=False)

    def _check_integrity(self) -> bool:
        folder = Path(self.root, self.base_folder)
        return all((folder / name).is_file() for name in _CIFAR_FILES)


def _cifar10_root(data_dir: str | os.PathLike) -> tuple[Path, str]:
    """(torchvision root, batches folder name) of a CIFAR-10 data_dir; FileNotFoundError if not."""
    data_dir = Path(data_dir).expanduser()
    if not data_dir.is_dir():
        raise _missing(data_dir, "does not exist or is not a directory", _CIFAR_HOWTO)
    if (data_dir / _CIFAR_FOLDER).is_dir():
        root, folder = data_dir, _CIFAR_FOLDER
    elif (data_dir / "batches.meta").is_file():  # data_dir is the batches folder itself
        root, folder = data_dir.parent, data_dir.name
    else:
        raise _missing(data_dir, f"has no {_CIFAR_FOLDER}/", _CIFAR_HOWTO)
    absent = [name for name in _CIFAR_FILES if not (root / folder / name).is_file()]
    if absent:
        raise _missing(data_dir, f"lacks {folder}/{{{','.join(absent)}}}", _CIFAR_HOWTO)
    return root, folder


def cifar10(data_dir: str | os.PathLike, augment: bool = True) -> tuple[Dataset, Dataset, int, int]:
    """Return ``(train, test, num_classes=10, image_size=32)`` for CIFAR-10 under ``data_dir``.

    ``data_dir`` is either the folder holding ``cifar-10-batches-py/`` (torchvision's ``root``) or
    that batches folder itself. ``augment=False`` gives the train set the test transform.
    """
    root, folder = _cifar10_root(data_dir)
    normalise = [transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
    test_tf = transforms.Compose(normalise)
    train_tf = test_tf
    if augment:
        train_tf = transforms.Compose(
            [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), *normalise]
        )
    train = _CIFAR10Files(root, folder, train=True, transform=train_tf)
    test = _CIFAR10Files(root, folder, train=False, transform=test_tf)
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
        _cifar10_root(data_dir)
    elif dataset == "imagenet":
        _imagenet_classes(Path(data_dir).expanduser())


def imagenet(
    data_dir: str | os.PathLike, image_size: int = 224
) -> tuple[Dataset, Dataset, int, int]:
    """Return ``(train, val, num_classes, image_size)`` for an ImageFolder tree under ``data_dir``.

    Labels are the indices of the sorted class-folder names, identical for train and val.
    """
    data_dir = Path(data_dir).expanduser()
    train_classes = _imagenet_classes(data_dir)
    normalise = [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    # fb.resnet.torch, whose recipe Goyal et al. follow, also applies colour augmentation (colour
    # jitter plus AlexNet-style PCA lighting). It is left out: it is expected to be a small effect
    # on final error, it is the same at every minibatch size so it does not change the comparisons
    # this study replays, and per-image colour work costs CPU that the data loader can rarely
    # spare. Absolute top-1 may therefore come out slightly worse than the paper's.
    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
            transforms.RandomHorizontalFlip(),
            *normalise,
        ]
    )
    val_tf = transforms.Compose(
        [
            transforms.Resize(int(image_size * 256 / 224)),  # 256 for 224, the usual ratio
            transforms.CenterCrop(image_size),
            *normalise,
        ]
    )
    train = datasets.ImageFolder(str(data_dir / "train"), transform=train_tf)
    val = datasets.ImageFolder(str(data_dir / "val"), transform=val_tf)
    return train, val, len(train_classes), image_size
