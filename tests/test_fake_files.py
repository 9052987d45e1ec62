"""Fake dataset files: the layouts the real readers read, and JPEGs that decode like photographs."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import lbsgd
from PIL import Image
from torchvision import datasets

from lbsgd.data import fake_files, folders


class _TorchvisionCIFAR10(datasets.CIFAR10):
    """torchvision's own reader; only its md5 checks against the official archive are skipped."""

    meta = {**datasets.CIFAR10.meta, "md5": None}  # md5=None: check_integrity tests existence

    def _check_integrity(self) -> bool:
        return True


def test_cifar10_files_read_back_by_torchvision_and_lbsgd(tmp_path):
    fake_files.write_cifar10(tmp_path, train=23, test=7, seed=1)
    train = _TorchvisionCIFAR10(tmp_path, train=True)
    test = _TorchvisionCIFAR10(tmp_path, train=False)
    assert train.data.shape == (23, 32, 32, 3) and train.data.dtype == np.uint8
    assert len(test) == 7 and train.classes == list(fake_files.CIFAR10_NAMES)
    assert set(train.targets) == set(range(10))  # labels cycle through the classes
    ours, our_test, classes, size = folders.cifar10(tmp_path, augment=False)
    assert (len(ours), len(our_test), classes, size) == (23, 7, 10, 32)
    assert ours.labels.tolist() == train.targets
    assert torch.equal(ours.images.permute(0, 2, 3, 1), torch.from_numpy(train.data))


def test_imagenet_files_are_imagefolder_jpegs_of_the_asked_size(tmp_path):
    fake_files.write_imagenet(tmp_path, train=7, val=4, classes=3, size=(120, 90), seed=2)
    train, val, classes, _ = folders.imagenet(tmp_path)
    assert (len(train), len(val), classes) == (7, 4, 3)
    assert train.classes == ["n00000000", "n00000001", "n00000002"] == val.classes
    assert [label for _, label in train.samples].count(0) == 3  # dealt round-robin
    for path, _ in train.samples + val.samples:
        assert path.endswith(".JPEG")
        with Image.open(path) as image:
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (120, 90))


def test_same_seed_same_bytes_other_seed_other_images(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        fake_files.write_imagenet(
            tmp_path / name, train=2, val=2, classes=2, size=(64, 48), seed=seed
        )
    file = "train/n00000000/n00000000_0.JPEG"
    a, b, c = ((tmp_path / n / file).read_bytes() for n in "abc")
    assert a == b and a != c


def test_existing_non_empty_dir_is_refused_and_left_alone(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        fake_files.write_cifar10(tmp_path, train=5, test=1)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    fake_files.write_cifar10(tmp_path / "empty_is_fine", train=5, test=1)


def _jpeg(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=fake_files.JPEG_QUALITY)
    return out.getvalue()


def test_fake_jpegs_are_photo_like_not_noise_in_entropy():
    """JPEG size per pixel measures what decoding costs (entropy-coded bits): pure noise takes ~0.9
    bytes per pixel at quality 90, a flat ramp almost nothing; the fake images must sit well between
    (decoding them took ~0.9 ms against ~4.5 ms for noise here; timings are not asserted)."""
    rng = np.random.default_rng(0)
    w, h = fake_files.IMAGENET_SIZE
    fake = [_jpeg(fake_files.natural_image(np.random.default_rng(i), w, h)) for i in range(6)]
    noise = [_jpeg(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(6)]
    ramp = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] * np.ones((h, 1, 3))
    smooth = [_jpeg(np.roll(ramp, 40 * i, axis=1).astype(np.uint8)) for i in range(6)]

    def per_pixel(blobs):
        return sum(map(len, blobs)) / (len(blobs) * w * h)

    assert per_pixel(fake) < 0.5 * per_pixel(noise)
    assert per_pixel(fake) > 2 * per_pixel(smooth)  # but not a flat gradient either


@pytest.mark.slow
def test_cli_writes_then_refuses_the_same_dir_in_one_line(tmp_path):
    cmd = [
        "data",
        "fake",
        "imagenet",
        str(tmp_path / "d"),
        "--train",
        "3",
        "--val",
        "3",
        "--classes",
        "3",
        "--width",
        "40",
        "--height",
        "30",
    ]
    first = lbsgd(cmd)
    assert first.returncode == 0, first.stderr
    assert len(list((tmp_path / "d" / "val").glob("*/*.JPEG"))) == 3
    again = lbsgd(cmd)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "not empty" in again.stderr
