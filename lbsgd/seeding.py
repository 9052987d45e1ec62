"""The seed streams of a run: every generator a run draws from, and the integer it is seeded with,
each a named function of the run's ``seed`` (the config key).

Per-position streams (:func:`sample_seeds`) give a sample or micro-batch the same seed at a given
place of the run's stream whatever the number of processes or loader workers, and after a resume.
One stream is not fed from the run seed: :func:`held_out`, so that every trial of a tuning sweep
validates on the same images. Saving and restoring the generators' states: ``lbsgd.checkpoint``."""

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
