"""The generated-shapes dataset: deterministic, balanced, learnable, standardised, cached safely."""

import numpy as np
import pytest
import torch

from lbsgd.data import synthetic

SMALL = {"train_size": 600, "test_size": 200, "difficulty": "easy"}


def _centred_masks(x: np.ndarray) -> np.ndarray:
    """Colour-free, roughly translation-free view: distance from the background colour (the
    per-image median), scaled to max 1, rolled so its centre of mass sits in the middle."""
    background = np.median(x.reshape(len(x), 3, -1), axis=2)[:, :, None, None]
    d = np.sqrt(((x - background) ** 2).sum(1))
    d /= d.reshape(len(d), -1).max(1)[:, None, None]
    n, h, w = d.shape
    rows, cols = np.mgrid[:h, :w]
    weight = d**2
    ci = (weight * rows).sum((1, 2)) / weight.sum((1, 2))
    cj = (weight * cols).sum((1, 2)) / weight.sum((1, 2))
    shifts = np.rint(np.stack([(h - 1) / 2 - ci, (w - 1) / 2 - cj], 1)).astype(int)
    return np.stack([np.roll(d[k], tuple(shifts[k]), (0, 1)) for k in range(n)]).reshape(n, -1)


def test_generate_is_deterministic_and_seed_dependent():
    x1, y1 = synthetic.generate(300, seed=5)
    x2, y2 = synthetic.generate(300, seed=5)
    assert x1.shape == (300, 3, 16, 16) and x1.dtype == np.float32
    assert y1.shape == (300,) and y1.dtype == np.int64
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)  # bitwise equal
    x3, _ = synthetic.generate(300, seed=6)
    assert not np.isclose(x1, x3).all(axis=(1, 2, 3)).any()  # no image repeats across seeds
    assert synthetic.generate(4, seed=5, image_size=24)[0].shape == (4, 3, 24, 24)


def test_labels_are_balanced_exactly_and_shuffled():
    _, y = synthetic.generate(1003, seed=1)
    assert np.bincount(y, minlength=10).tolist() == [101] * 3 + [100] * 7
    assert (np.diff(y) != 0).mean() > 0.5  # shuffled, not sorted or blocked by class
    assert len(synthetic.CLASSES) == 10


def test_load_splits_differ_and_are_standardised_with_train_statistics(tmp_path):
    x_train, y_train, x_test, y_test = synthetic.load(**SMALL, cache_dir=tmp_path)
    assert synthetic.TRAIN_SEED != synthetic.TEST_SEED
    assert x_train.dtype == x_test.dtype == torch.float32
    assert y_train.dtype == y_test.dtype == torch.int64
    assert x_train.shape == (600, 3, 16, 16) and x_test.shape == (200, 3, 16, 16)

    train = x_train.double()
    assert train.mean(dim=(0, 2, 3)).abs().max() < 1e-3
    assert (train.std(dim=(0, 2, 3), unbiased=False) - 1).abs().max() < 1e-3

    # The test split is standardised with the train mean/std, not its own.
    raw_train, raw_y_train = synthetic.generate(600, synthetic.TRAIN_SEED, "easy")
    raw_test, raw_y_test = synthetic.generate(200, synthetic.TEST_SEED, "easy")
    mean = raw_train.mean(axis=(0, 2, 3), dtype=np.float64)[None, :, None, None]
    std = raw_train.std(axis=(0, 2, 3), dtype=np.float64)[None, :, None, None]
    np.testing.assert_allclose(x_test.numpy(), (raw_test - mean) / std, atol=1e-5)
    assert np.array_equal(y_train.numpy(), raw_y_train)
    assert np.array_equal(y_test.numpy(), raw_y_test)

    # Independent draws: no test image equals any train image.
    flat_train, flat_test = raw_train.reshape(600, -1), raw_test.reshape(200, -1)
    distances = ((flat_test[:, None, :] - flat_train[None, :, :]) ** 2).sum(-1)
    assert distances.min() > 1.0


def test_cache_round_trips_without_regenerating(tmp_path, monkeypatch):
    first = synthetic.load(**SMALL, cache_dir=tmp_path)
    files = list((tmp_path / "synthetic").iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"  # no temp file left behind
    name = files[0].name
    assert f"v{synthetic.GENERATOR_VERSION}" in name and "easy" in name and "600" in name

    def boom(*args, **kwargs):
        raise AssertionError("load() regenerated instead of reading the cache")

    monkeypatch.setattr(synthetic, "generate", boom)
    second = synthetic.load(**SMALL, cache_dir=tmp_path)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(AssertionError, match="regenerated"):  # other parameters: another file
        synthetic.load(**SMALL, noise=0.07, cache_dir=tmp_path)


def test_cache_dir_defaults_to_lbsgd_cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LBSGD_CACHE", str(tmp_path))
    synthetic.load(train_size=20, test_size=10, difficulty="easy")
    assert len(list((tmp_path / "synthetic").glob("*.npz"))) == 1


def test_corrupt_cache_is_regenerated(tmp_path):
    first = synthetic.load(**SMALL, cache_dir=tmp_path)
    (path,) = (tmp_path / "synthetic").iterdir()
    path.write_bytes(path.read_bytes()[:1000])  # a torn write
    with pytest.warns(UserWarning, match="regenerating"):
        second = synthetic.load(**SMALL, cache_dir=tmp_path)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    third = synthetic.load(**SMALL, cache_dir=tmp_path)  # the rewritten file reads cleanly
    assert torch.equal(first[0], third[0])


def test_classes_are_learnable_by_nearest_class_mean():
    # Measured 0.68-0.72 over five seed pairs; shuffled labels give 0.02-0.13 (chance is 0.10).
    x_train, y_train = synthetic.generate(2000, seed=10, difficulty="easy")
    x_test, y_test = synthetic.generate(1000, seed=100, difficulty="easy")
    f_train, f_test = _centred_masks(x_train), _centred_masks(x_test)
    means = np.stack([f_train[y_train == c].mean(0) for c in range(10)])
    pred = ((f_test[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y_test).mean() > 0.5


def test_noise_dial_is_monotone():
    clean, y_clean = synthetic.generate(200, seed=3, noise=0.0)
    assert clean.min() >= 0 and clean.max() <= 1  # the noiseless render is a valid image
    deviations = []
    for sigma in (0.05, 0.10, 0.12, 0.18):
        noisy, y = synthetic.generate(200, seed=3, noise=sigma)
        assert np.array_equal(y, y_clean)  # noise changes pixels only, not the scene
        deviations.append(np.abs(noisy - clean).mean())
    assert np.all(np.diff(deviations) > 0)
    # The default standard noise is the documented sigma 0.12.
    default, _ = synthetic.generate(200, seed=3)
    assert np.array_equal(default, synthetic.generate(200, seed=3, noise=0.12)[0])


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"difficulty": "hard"}, "difficulty='hard' is not one of easy, standard"),
        ({"noise": -0.1}, "noise="),
        ({"noise": float("nan")}, "noise="),
        ({"n": 0}, "n=0"),
        ({"n": 2.5}, "n=2.5"),
        ({"seed": -1}, "seed=-1"),
        ({"image_size": 2}, "image_size=2"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(kwargs, argument):
    args = {"n": 10, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=argument.replace("(", r"\(")):
        synthetic.generate(**args)


@pytest.mark.parametrize("kwargs", [{"train_size": 0}, {"test_size": -5}, {"difficulty": "x"}])
def test_load_validates_arguments(kwargs, tmp_path):
    with pytest.raises(ValueError, match=next(iter(kwargs)) + "="):
        synthetic.load(**kwargs, cache_dir=tmp_path)
