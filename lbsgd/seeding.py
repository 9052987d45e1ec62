"""The seed streams of a run: every generator a run draws from, and the integer it is seeded with,
each a named function of the run's ``seed`` (the config key).

Streams fed from the run seed here:

- :func:`epoch_order`: the permutation of the training samples in epoch ``e``
  (``lbsgd.data.sampler.permutation``), ``seed * SEED_STRIDE + e``: distinct per (seed, epoch)
  for every epoch below the stride (``lbsgd.config`` keeps it below 2^64);
- :func:`fake_train` and :func:`fake_test`: the images and labels of the ``fake`` dataset's two
  splits, ``2 * seed`` and ``2 * seed + 1`` (independent draws; each split the same whatever the
  other's size);
- :func:`augmentation`: each training sample's random transform (crop, flip), seeded by its
  position in the run's stream, :func:`sample_seeds` of base ``2 * seed`` (the trainer, the
  parameter server's workers, ``lbsgd bench data``);
- :func:`micro_batches`: the randomness inside a step (dropout), drawn per global micro-batch,
  :func:`sample_seeds` of base ``2 * seed + 1``: never the augmentation's seeds.

One stream is not fed from the run seed: :func:`held_out`, the permutation that picks the held-out
validation images (``holdout``, :func:`lbsgd.data.hold_out`), seeded with the constant
:data:`HOLDOUT_SEED`, so that every trial of a tuning sweep (any seed, batch size or layout)
validates on the same images.

The per-position streams give the same seed to a sample (a micro-batch) at a given place of the
run's stream whatever the number of processes or loader workers, and after a resume. Where the
run seed is used as it is: the network's initial weights (:func:`initial_weights`, given to
``torch.manual_seed`` by the network's builder), the stale-weights delays (``lbsgd.staleness.draw``, a hash of seed, step and
worker) and the order of ``lbsgd bench data``'s batches. Seeding torch's generators before each
micro-batch: :func:`seed_generators`; saving and restoring their state in a checkpoint:
``lbsgd.checkpoint``.
"""

from __future__ import annotations

import numpy as np
import torch

from lbsgd.config import SEED_STRIDE

_GOLDEN, _MIX1, _MIX2 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)


def epoch_order(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s permutation of the training samples."""
    return seed * SEED_STRIDE + epoch


def fake_train(seed: int) -> int:
    """The seed of the ``fake`` dataset's train split (torch's CPU generator)."""
    return 2 * seed


def fake_test(seed: int) -> int:
    """The seed of the ``fake`` dataset's test split: never the train split's."""
    return 2 * seed + 1


def augmentation(seed: int, positions: torch.Tensor) -> torch.Tensor:
    """The seed of each training sample's random transform, by its stream position (samples
    since the run began)."""
    return sample_seeds(2 * seed, positions)


def micro_batches(seed: int, indices: torch.Tensor) -> torch.Tensor:
    """The seed of the randomness inside a step (dropout) of each global micro-batch (its index:
    micro-batches since the run began), with which torch's generators are seeded before its
    forward pass."""
    return sample_seeds(2 * seed + 1, indices)


def sample_seeds(seed: int, positions: torch.Tensor) -> torch.Tensor:
    """A seed per stream position: SplitMix64 of (seed, position), in [0, 2^63).

    z = seed·φ + (p + 1)·m1, then z ← (z ^ z >> 30)·m1, z ← (z ^ z >> 27)·m2, seed = (z ^ z >> 31)
    >> 1, all modulo 2^64: unsigned 64-bit array arithmetic, vectorised (the training stream asks
    for a micro-batch's seeds at every step, on the thread that feeds the device)."""
    p = positions.numpy().astype(np.uint64).reshape(-1)
    s = np.full(p.shape, seed & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
    z = s * _GOLDEN + (p + np.uint64(1)) * _MIX1  # uint64 arrays wrap modulo 2^64
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return torch.from_numpy(((z ^ (z >> np.uint64(31))) >> np.uint64(1)).astype(np.int64))


# The seed of the held-out split's permutation: one number for every run. As a data-order seed it
# would be seed 0's epoch SEED_STRIDE - 1 = 1,000,002, which no run reaches.
HOLDOUT_SEED = SEED_STRIDE - 1


def held_out() -> int:
    """The seed of the permutation of the train indices whose first ``holdout`` are held out as
    the validation split: :data:`HOLDOUT_SEED`, whatever the run seed."""
    return HOLDOUT_SEED


def initial_weights(seed: int) -> int:
    """The seed of the network's initial weights: the run seed itself (the same on every rank and
    for every layout)."""
    return seed


def seed_generators(seed: int, device: torch.device) -> None:
    """Seed the generators a step draws from: the CPU's, and the training GPU's. (torch.manual_seed
    also queues seeds for every other device type, capturing a traceback for each, on every
    call: a measurable share of a small CPU step.)"""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the current device: distributed.init set it to ours
