"""Random images of ImageNet's shape: throughput measurements of ImageNet models without ImageNet.

Nothing to learn here (the labels are independent of the pixels; use ``synthetic`` to see a model
train): what a speed measurement needs is the shape, 3 x 224 x 224 inputs and a 1000-way classifier
by default. Pixels are uniform over 0..255, standardised with that distribution's mean and
deviation, in float32 (588 KiB an image, hence small default counts). The splits are seeded by
:func:`lbsgd.seeding.fake_train` and :func:`lbsgd.seeding.fake_test`."""

from __future__ import annotations

import functools
import math

import torch

from lbsgd import seeding

_CHUNK = 256  # images drawn at once: the uint8 scratch stays ~40 MB at 224 x 224
_MEAN, _STD = 127.5, 255 / math.sqrt(12)


def images(n: int, size: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images float32 (n, 3, size, size) standardised, labels int64 (n,) in [0, classes))."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    x = torch.empty(n, 3, size, size)  # the only full-size allocation: no float64, no second copy
    for start in range(0, n, _CHUNK):
        chunk = x[start : start + _CHUNK]
        u8 = torch.randint(0, 256, chunk.shape, generator=g, dtype=torch.uint8)
        chunk.copy_(u8).sub_(_MEAN).div_(_STD)
    return x, labels


# Kept for the process's life: a benchmark builds the same splits for every measurement, and drawing
# 2,560 images costs seconds. Callers never write into them (batches are indexed copies).
@functools.lru_cache(maxsize=1)
def splits(
    train: int, test: int, size: int, classes: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x_train, y_train, x_test, y_test (see :func:`images`)."""
    x_tr, y_tr = images(train, size, classes, seeding.fake_train(seed))
    x_te, y_te = images(test, size, classes, seeding.fake_test(seed))
    return x_tr, y_tr, x_te, y_te
