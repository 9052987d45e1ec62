"""Fake CIFAR-10 and ImageNet *files*, in the exact on-disk layouts :mod:`lbsgd.data.folders` reads.

``lbsgd data fake cifar10 DIR`` / ``lbsgd data fake imagenet DIR`` write them, so that the file
pipelines can be tested and benchmarked without a download; labels are independent of the pixels.
The pixels are smooth and natural-like, not noise, so that a JPEG decodes about as fast as a
photograph's (docs/datasets.md). Image ``i`` of a split is drawn from
``numpy.random.default_rng((seed, split, i))``; a target that exists and is not empty is refused."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

CIFAR10_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR10_TRAIN_BATCHES = 5  # data_batch_1..5, as torchvision's CIFAR10 reads them
# ImageNet's typical JPEG: 500 x 375 (w x h) is the most common ILSVRC-2012 size; quality 90 is
# about what its files were saved at (Flickr re-encodes).
IMAGENET_SIZE = (500, 375)
JPEG_QUALITY = 90


class _Py2Pickler(pickle._Pickler):
    """Pickles bytes as Python 2 ``str`` (SHORT_BINSTRING/BINSTRING opcodes), as the real CIFAR-10
    files do (they were written by Python 2 cPickle). Loaded with encoding="latin1", as torchvision
    does, the keys come back as "data"; with encoding="bytes" as b"data". Python 3's own pickler
    would store b"data" as bytes, which torchvision's entry["data"] lookup does not find."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def _save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str


def dump_py2(obj: dict, path: Path) -> None:
    """Write ``obj`` as the CIFAR-10 python version's files are written (see :class:`_Py2Pickler`)."""
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(obj)


def _target(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` created if absent; FileExistsError (one line) if it exists and is not empty."""
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not empty: give a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _check_counts(**counts: int) -> None:
    for name, n in counts.items():
        if n < 1:
            raise ValueError(f"--{name}={n} must be a positive integer")


def _upsample(field: np.ndarray, h: int, w: int) -> np.ndarray:
    """(C, gh, gw) float32 -> (C, h, w), bicubic: a smooth interpolation of the grid's values."""
    t = torch.from_numpy(field)[None]
    return F.interpolate(t, size=(h, w), mode="bicubic", align_corners=False)[0].numpy()


def natural_image(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A smooth natural-like (height, width, 3) uint8 image: random colour fields at three
    scales, a few ellipses, rectangles and lines, ±5 levels of noise (JPEG noise would hold ~0.9
    bytes per pixel and decode ~4x slower than a photograph; these hold ~0.3)."""
    # colour fields at 1/4 resolution (one full-size upsampling, ~35 ms at 500x375): a scene-wide
    # gradient (3x4 grid), object-sized blobs (12x16) and texture at the 1/4-resolution grid itself
    lh, lw = max(1, (height + 3) // 4), max(1, (width + 3) // 4)
    low = rng.uniform(40, 215, (3, 1, 1)).astype(np.float32)
    for (gh, gw), amplitude in (((3, 4), 45.0), ((12, 16), 20.0), ((lh, lw), 24.0)):
        grid = rng.normal(0, amplitude, (3, min(gh, lh), min(gw, lw))).astype(np.float32)
        low = low + _upsample(grid, lh, lw)
    img = Image.fromarray(
        np.clip(_upsample(low, height, width), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    )
    draw = ImageDraw.Draw(img)  # sharp edges, as objects have
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = rng.uniform(-0.2, 1.0, 2) * (width, height)
        x1, y1 = (x0, y0) + rng.uniform(0.05, 0.6, 2) * (width, height)
        box = [float(x0), float(y0), float(x1), float(y1)]
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = int(rng.integers(3))
        if shape == 0:
            draw.ellipse(box, fill=colour)
        elif shape == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.line(box, fill=colour, width=int(rng.integers(2, 12)))
    noise = rng.integers(-5, 6, (height, width, 3), dtype=np.int16)  # sensor noise, ±5 levels
    return np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)


def _cifar10_pixels(rng: np.random.Generator, n: int) -> np.ndarray:
    """n smooth 32x32 images as CIFAR rows (N, 3072): colour fields at 2 scales, ±5 noise."""
    x = torch.from_numpy(rng.uniform(40, 215, (n, 3, 1, 1)).astype(np.float32))
    for grid, amplitude in ((2, 45.0), (8, 25.0)):
        g = torch.from_numpy(rng.normal(0, amplitude, (n, 3, grid, grid)).astype(np.float32))
        x = x + F.interpolate(g, size=(32, 32), mode="bicubic", align_corners=False)
    x = x + torch.from_numpy(rng.integers(-5, 6, x.shape).astype(np.float32))
    return x.clamp(0, 255).to(torch.uint8).reshape(n, 3072).numpy()


def write_cifar10(
    out_dir: str | os.PathLike, train: int = 50_000, test: int = 10_000, seed: int = 0
) -> Path:
    """``out_dir/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}`` with ``train``
    images split over the 5 batches and ``test`` in test_batch; each split's labels cycle through
    the 10 classes, in a seeded order. Returns the batches folder."""
    _check_counts(train=train, test=test)
    if train < CIFAR10_TRAIN_BATCHES:
        raise ValueError(
            f"--train={train} must be at least {CIFAR10_TRAIN_BATCHES} (one per batch)"
        )
    folder = _target(out_dir) / "cifar-10-batches-py"
    folder.mkdir()
    sizes = [train * (k + 1) // 5 - train * k // 5 for k in range(CIFAR10_TRAIN_BATCHES)]
    names = [f"data_batch_{k + 1}" for k in range(CIFAR10_TRAIN_BATCHES)] + ["test_batch"]
    # every class equally often over the train split (and the test split), in a seeded order
    order = np.random.default_rng((seed, len(names))).permutation(np.arange(train) % 10)
    starts = np.cumsum([0, *sizes])
    for split, (name, n) in enumerate(zip(names, [*sizes, test], strict=True)):
        rng = np.random.default_rng((seed, split))
        labels = (
            order[starts[split] : starts[split] + n]
            if name != "test_batch"
            else (rng.permutation(np.arange(n) % 10))
        )
        entry = {b"data": _cifar10_pixels(rng, n), b"labels": [int(c) for c in labels]}
        dump_py2({b"batch_label": name.encode(), **entry}, folder / name)
    meta = {b"label_names": [c.encode() for c in CIFAR10_NAMES], b"num_vis": 3072}
    dump_py2(meta, folder / "batches.meta")
    return folder


def write_imagenet(
    out_dir: str | os.PathLike,
    train: int = 1_000,
    val: int = 200,
    classes: int = 10,
    size: tuple[int, int] = IMAGENET_SIZE,
    quality: int = JPEG_QUALITY,
    seed: int = 0,
) -> Path:
    """``out_dir/{train,val}/<class>/*.JPEG`` (ImageFolder, as ILSVRC-2012 after val is sorted
    into class folders): ``train`` and ``val`` images dealt round-robin over ``classes`` folders
    named like WordNet ids (n00000000, …), each a ``size`` = (width, height) JPEG. Returns out_dir."""
    _check_counts(train=train, val=val, classes=classes, width=size[0], height=size[1])
    if min(train, val) < classes:  # ImageFolder refuses an empty class folder
        raise ValueError(f"--train={train} and --val={val} must be at least --classes={classes}")
    if not 1 <= quality <= 95:
        raise ValueError(f"--quality={quality} must be in 1..95 (PIL's useful JPEG range)")
    out = _target(out_dir)
    names = [f"n{c:08d}" for c in range(classes)]
    for split_id, (split, n) in enumerate((("train", train), ("val", val))):
        for c in names:
            (out / split / c).mkdir(parents=True)
        for i in range(n):
            rng = np.random.default_rng((seed, split_id, i))
            c = names[i % classes]
            # ImageNet's names: n01440764_10026.JPEG in train, ILSVRC2012_val_00000001.JPEG in val
            stem = f"{c}_{i}" if split == "train" else f"ILSVRC2012_val_{i + 1:08d}"
            Image.fromarray(natural_image(rng, *size)).save(
                out / split / c / f"{stem}.JPEG", "JPEG", quality=quality
            )
    return out
