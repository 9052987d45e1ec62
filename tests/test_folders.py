"""Tests for lbsgd.data.folders on tiny datasets in the real on-disk formats, written here (the
CIFAR-10 files by tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CIFAR_NAMES, normalise, write_cifar
from PIL import Image

from lbsgd.data.folders import CIFAR10_MEAN, CIFAR10_STD, cifar10, imagenet

# ----------------------------------------------------------------------------------- CIFAR-10


@pytest.fixture
def cifar_dir(tmp_path):
    return tmp_path, write_cifar(tmp_path)


def test_cifar10_sizes_labels_and_test_pixels(cifar_dir):
    root, written = cifar_dir
    train, test, num_classes, image_size = cifar10(root)
    assert (num_classes, image_size) == (10, 32)
    assert (len(train), len(test)) == (15, 4)
    assert train.classes == CIFAR_NAMES

    train_labels = sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert [train[i][1] for i in range(len(train))] == train_labels
    assert all(type(train[i][1]) is int for i in range(len(train)))
    assert [test[i][1] for i in range(len(test))] == written["test_batch"][1]

    data, _ = written["test_batch"]
    for i in range(len(test)):
        image, _ = test[i]
        assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
        expected = normalise(data[i].reshape(3, 32, 32), CIFAR10_MEAN, CIFAR10_STD)
        np.testing.assert_allclose(image.numpy(), expected, atol=1e-5)


def test_cifar10_accepts_the_batches_folder_itself(cifar_dir):
    root, written = cifar_dir
    train, test, _, _ = cifar10(root / "cifar-10-batches-py")
    assert (len(train), len(test)) == (15, 4)
    assert train.labels[:3].tolist() == written["data_batch_1"][1]
    # augment=False: tests/test_cifar_device.py (only normalised, as the test split)


def _crop_flip_of(padded: np.ndarray, view: np.ndarray) -> tuple[int, int, bool] | None:
    """Which (top, left, flipped) 32x32 window of the 40x40 padded image equals view, if any."""
    for top in range(9):
        for left in range(9):
            window = padded[:, top : top + 32, left : left + 32]
            for flipped in (False, True):
                candidate = window[:, :, ::-1] if flipped else window
                if np.allclose(candidate, view, atol=1e-5):
                    return top, left, flipped
    return None


def test_cifar10_train_augmentation_is_random_pad_crop_flip(cifar_dir):
    root, written = cifar_dir
    train, _, _, _ = cifar10(root)
    pixels = written["data_batch_1"][0][0].reshape(3, 32, 32)
    # Zero padding happens on raw pixels, so the padded border normalises to -mean/std.
    padded = normalise(np.pad(pixels, ((0, 0), (4, 4), (4, 4))), CIFAR10_MEAN, CIFAR10_STD)

    torch.manual_seed(0)
    views = [train[0][0] for _ in range(40)]
    placements = set()
    for view in views:
        assert view.dtype == torch.float32 and view.shape == (3, 32, 32)
        placement = _crop_flip_of(padded, view.numpy())
        assert placement is not None, "augmented image is not a crop/flip of the padded image"
        placements.add(placement)
    assert len(placements) > 10  # 162 possible placements: the crop varies
    assert {flipped for _, _, flipped in placements} == {False, True}  # and so does the flip
    offsets = {top for top, _, _ in placements} | {left for _, left, _ in placements}
    assert {0, 8} <= offsets  # the extreme windows exist only with the full 4-pixel padding

    torch.manual_seed(0)  # same seed, same draws
    assert all(torch.equal(train[0][0], view) for view in views[:5])


def test_cifar10_missing_data_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir=.*nowhere.*does not exist"):
        cifar10(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"data_dir=.*has no cifar-10-batches-py/") as info:
        cifar10(tmp_path)
    assert "download=True" in str(info.value) and "\n" not in str(info.value)
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_dir=.*data_batch_3"):
        cifar10(tmp_path)


# ----------------------------------------------------------------------------------- ImageNet

CLASSES = ["n01", "n02", "n03"]


def _write_imagefolder(root: Path, classes=CLASSES, per_class: int = 4) -> None:
    """Write train/ and val/ ImageFolder trees of 40x30 (w x h) random-pixel PNGs (lossless)."""
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for j in range(per_class):
                pixels = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{c}_{j}.png")


def test_imagenet_classes_labels_and_uint8_random_crops(tmp_path):
    _write_imagefolder(tmp_path)
    train, val, num_classes, image_size = imagenet(tmp_path, image_size=32)
    assert (num_classes, image_size) == (3, 32)
    assert (len(train), len(val)) == (12, 12)
    assert train.class_to_idx == val.class_to_idx == {c: i for i, c in enumerate(CLASSES)}
    assert [label for _, label in train.samples] == [0] * 4 + [1] * 4 + [2] * 4

    torch.manual_seed(0)
    crops = [train[i][0] for i in range(len(train))]
    # items are uint8 crops; the float cast and normalisation happen per batch (data.batches)
    assert all(x.dtype == torch.uint8 and x.shape == (3, 32, 32) for x in crops)
    assert not torch.equal(train[0][0], train[0][0])  # random resized crop differs per draw
    assert type(train[5][1]) is int and train[5][1] == 1
    # the val transform, resize then centre crop, by hand: tests/test_imagenet_pipeline.py


def test_imagenet_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir=.*nowhere.*does not exist"):
        imagenet(tmp_path / "nowhere")
    (tmp_path / "train" / "n01").mkdir(parents=True)
    with pytest.raises(
        FileNotFoundError, match="data_dir=.*has no class folders under val/"
    ) as info:
        imagenet(tmp_path)
    assert "ImageFolder" in str(info.value) and "\n" not in str(info.value)

    other = tmp_path / "mismatch"
    _write_imagefolder(other, per_class=1)
    (other / "val" / "n03").rename(other / "val" / "n04")
    with pytest.raises(FileNotFoundError, match="different class folders") as info:
        imagenet(other)
    message = str(info.value)
    assert str(other / "train") in message and str(other / "val") in message
    assert "'n03'" in message and "'n04'" in message
