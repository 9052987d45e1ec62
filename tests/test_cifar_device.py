"""CIFAR-10 as uint8 tensors, augmented and normalised in batches (lbsgd.data.device_images).

The properties: the batched pad-crop-flip is the per-sample one of He et al. §4.2; a sample's
placement depends only on its seed (its position in the run's stream), so any cut of the stream
into micro-batches, or a restart part-way, gives the same images; offsets and flips are uniform;
the test split is only normalised. Training runs on these files are in tests/test_distributed.py
(layouts) and tests/test_resume.py (kill and resume).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import normalise, write_cifar

from lbsgd import data
from lbsgd.data.device_images import PAD, DeviceImages, pad_crop_flip, placements
from lbsgd.data.folders import CIFAR10_MEAN, CIFAR10_STD, cifar10


def _reference(image: np.ndarray, top: int, left: int, flip: int) -> np.ndarray:
    """Pad-crop-flip of one CHW image, written out: zero-pad 4 pixels, take the 32x32 window at
    (top, left), mirror it left-right if flip."""
    padded = np.pad(image, ((0, 0), (PAD, PAD), (PAD, PAD)))
    window = padded[:, top : top + 32, left : left + 32]
    return window[:, :, ::-1] if flip else window


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(data_dir, what was written per file) of 5 x 16 training and 8 test images."""
    root = tmp_path_factory.mktemp("cifar")
    return root, write_cifar(root, per_batch=16, n_test=8)


@pytest.fixture(scope="module")
def splits(files):
    return cifar10(files[0]), files[1]


def test_pad_crop_flip_equals_the_per_sample_reference_for_every_placement():
    rng = np.random.default_rng(0)
    n = 2 * 9 * 9  # every (top, left), each unflipped and flipped
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    top, left, flip = (
        t.flatten()
        for t in torch.meshgrid(torch.arange(9), torch.arange(9), torch.arange(2), indexing="ij")
    )
    out = pad_crop_flip(torch.from_numpy(images), top, left, flip)
    assert out.dtype == torch.uint8 and out.shape == (n, 3, 32, 32) and out.is_contiguous()
    for b in range(n):
        expected = _reference(images[b], int(top[b]), int(left[b]), int(flip[b]))
        assert np.array_equal(out[b].numpy(), expected), (int(top[b]), int(left[b]), int(flip[b]))


def test_train_batch_is_the_seeded_placement_of_each_image_then_normalised(splits):
    (train, _, _, _), written = splits
    raw = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)])
    idx = torch.tensor([3, 0, 79, 3, 41])  # a repeated image gets its own placement per position
    seeds = data.sample_seeds(11, torch.arange(100, 105))
    ((x, y),) = data.batches(train, [idx], seeds=[seeds], device=torch.device("cpu"))
    assert x.dtype == torch.float32 and x.shape == (5, 3, 32, 32)
    labels = sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert y.tolist() == [labels[i] for i in idx]
    top, left, flip = placements(seeds)
    for b, i in enumerate(idx.tolist()):
        view = _reference(raw[i].reshape(3, 32, 32), int(top[b]), int(left[b]), int(flip[b]))
        expected = normalise(view, CIFAR10_MEAN, CIFAR10_STD)
        np.testing.assert_allclose(x[b].numpy(), expected, atol=1e-5)


def test_test_split_and_unaugmented_train_are_only_normalised(splits, files):
    (_, test, _, _), written = splits
    plain, _, _, _ = cifar10(files[0], augment=False)
    seeds = data.sample_seeds(0, torch.arange(8))  # seeds given, and still no augmentation
    for split, name in ((test, "test_batch"), (plain, "data_batch_1")):
        ((x, y),) = data.batches(split, [torch.arange(8)], seeds=[seeds])
        pixels, labels = written[name]
        for b in range(8):
            expected = normalise(pixels[b].reshape(3, 32, 32), CIFAR10_MEAN, CIFAR10_STD)
            np.testing.assert_allclose(x[b].numpy(), expected, atol=1e-5)
        assert y.tolist() == labels[:8]
        assert split.images.dtype == torch.uint8  # held compact; floats exist per batch only


def test_same_positions_give_the_same_images_whatever_the_micro_batches_or_restart(splits):
    (train, _, _, _), _ = splits
    idx = torch.arange(len(train)).repeat(2)[torch.randperm(2 * len(train))]
    seeds = data.sample_seeds(5, torch.arange(len(idx)))

    def stream(cut: list[int], start: int = 0) -> torch.Tensor:
        parts = list(idx[start:].split(cut)), list(seeds[start:].split(cut))
        return torch.cat([x for x, _ in data.batches(train, parts[0], seeds=parts[1])])

    whole = stream([len(idx)])
    assert torch.equal(stream([16] * 10), whole)
    assert torch.equal(stream([3, 77, 40, 40]), whole)
    assert torch.equal(stream([32] * 4, start=32), whole[32:])  # a resume at position 32
    # and the augmentation is not the identity: the two positions of each image mostly differ
    first = {}
    differ = 0
    for pos, i in enumerate(idx.tolist()):
        if i in first:
            differ += not torch.equal(whole[first[i]], whole[pos])
        first[i] = pos
    assert differ >= 0.8 * len(train)


def test_offsets_and_flips_are_uniform_and_independent():
    seeds = data.sample_seeds(3, torch.arange(81_000))
    top, left, flip = placements(seeds)
    for name, offsets in (("top", top), ("left", left)):
        counts = torch.bincount(offsets, minlength=9)
        assert len(counts) == 9, name  # nothing outside 0..8
        assert (counts - 9000).abs().max() < 600, (name, counts)  # sd ~ 89 per bin
    pairs = torch.bincount(top * 9 + left, minlength=81)  # disjoint bits: independent offsets
    assert (pairs - 1000).abs().max() < 200, pairs
    assert abs(int(flip.sum()) - 40_500) < 1_000
    flip_top = torch.bincount(flip * 9 + top, minlength=18)  # the flip bit is not an offset bit
    assert (flip_top - 4500).abs().max() < 400, flip_top


def test_splits_move_to_the_device_once_as_uint8(splits):
    (train, test, _, _), _ = splits
    s = data.Splits(train, test, 10, 32)
    moved = data.resident(s, torch.device("meta"))  # any non-host device takes the same path
    for ds in (moved.train, moved.test):
        assert isinstance(ds, DeviceImages) and ds.images.device.type == "meta"
        assert ds.images.dtype == torch.uint8
    assert moved.train.augment and not moved.test.augment
    assert train.pad == moved.train.pad == PAD == 4  # He et al.'s 4 pixels, kept by .to()
    assert data.resident(s, torch.device("cpu")) is s  # the host copy is the one read


def test_malformed_batch_file_names_the_file(tmp_path):
    write_cifar(tmp_path)
    import pickle

    path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    with open(path, "wb") as f:
        pickle.dump({"data": np.zeros((3, 100), np.uint8), "labels": [0, 1, 2]}, f)
    with pytest.raises(ValueError, match="data_batch_2.*3072-byte row"):
        cifar10(tmp_path)
