"""dataset=fashion_mnist on the real files (Debian's dataset-fashion-mnist, or `lbsgd data fetch
fashion_mnist`): what is read is what the IDX files hold, a damaged or foreign file is refused in
one line naming it, every layout and format reads the same tensors, and augmentation is a function
of the stream position. Without the files these tests skip saying how to get them; under CI=true
they fail (tests/conftest.py: real_fashion_mnist)."""

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import real_fashion_mnist

from lbsgd import cli, config, data, models
from lbsgd.config import Config, ConfigError
from lbsgd.data import fashion_mnist
from lbsgd.data.device_images import pad_crop_flip, placements
from lbsgd.data.fashion_mnist import ALL_FILES, FILES, MEAN, STD

NAMES = [f.name for f in ALL_FILES]
TRAIN_LABELS = FILES["train"][1]


def _idx(folder: Path, name: str) -> np.ndarray:
    """An IDX file of unsigned bytes read by hand: big-endian magic (0x0000 08 nd), nd big-endian
    uint32 dimensions, then the data."""
    raw = gzip.decompress((folder / f"{name}.gz").read_bytes())
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


@pytest.fixture(scope="module")
def splits(fashion_mnist_dir):
    """The registered dataset as a run builds it (data_dir=null: the default folder), on the CPU."""
    return data.build(Config(dataset="fashion_mnist", device="cpu"), torch.device("cpu"))


def test_the_splits_hold_60000_and_10000_images_6000_and_1000_per_class(splits):
    assert (splits.num_classes, splits.image_size) == (10, 28)
    for split, n in ((splits.train, 60_000), (splits.test, 10_000)):
        assert split.images.dtype == torch.uint8 and tuple(split.images.shape) == (n, 1, 28, 28)
        assert torch.bincount(split.labels, minlength=10).tolist() == [n // 10] * 10
    assert splits.train.augment and not splits.test.augment


@pytest.mark.slow  # the splits' fixture (~1.8 s) included
def test_the_images_and_labels_are_the_idx_files_read_by_hand(splits, fashion_mnist_dir):
    for split, (images, labels) in zip((splits.train, splits.test), FILES.values(), strict=True):
        by_hand = _idx(fashion_mnist_dir, images.name)
        assert np.array_equal(split.images[:, 0].numpy(), by_hand)
        assert split.labels.tolist() == _idx(fashion_mnist_dir, labels.name).tolist()
    assert splits.train.labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]


@pytest.mark.slow  # the splits' fixture (~1.8 s) included
def test_a_batch_is_three_equal_channels_standardised_with_the_training_statistics(
    splits, fashion_mnist_dir
):
    x, y = data.batches(splits.test, [torch.tensor([0, 1])]).__next__()
    assert x.dtype == torch.float32 and tuple(x.shape) == (2, 3, 28, 28) and y.tolist() == [9, 2]
    first = _idx(fashion_mnist_dir, "t10k-images-idx3-ubyte")[0].astype(np.float64)
    hand = torch.from_numpy((first / 255 - MEAN[0]) / STD[0]).float()
    for c in range(3):
        torch.testing.assert_close(x[0, c], hand, rtol=0, atol=1e-5)
    net = models.build(Config(model="resnet", depth=8, width=8), 10, splits.image_size)
    assert tuple(net(x).shape) == (2, 10)
    # the statistics are the training set's: its standardised pixels have mean 0 and std 1
    counts = torch.bincount(splits.train.images.flatten(), minlength=256).double()
    values = torch.arange(256, dtype=torch.float64) / 255
    mean = (counts * values).sum() / counts.sum()
    std = ((counts * (values - mean) ** 2).sum() / counts.sum()).sqrt()
    assert abs((mean.item() - MEAN[0]) / STD[0]) < 1e-3 and abs(std.item() / STD[0] - 1) < 1e-3


def _augmented(ds, world: int, micro: int, start: int, steps: int) -> torch.Tensor:
    """Steps [start, steps) of batch 32 as every rank of a world of ``world`` processes with
    micro-batch ``micro`` augments them (the trainer's seeds: its stream positions), in stream
    order."""
    out = []
    for t in range(start, steps):
        for rank in range(world):
            s = data.StepSampler(
                num_samples=len(ds),
                batch_size=32,
                micro_batch=micro,
                rank=rank,
                world_size=world,
                seed=0,
                total_steps=steps,
                start_step=start,
            )
            seeds = (data.sample_seeds(0, p) for p in s.rank_positions(t))
            out += [x for x, _ in data.batches(ds, s.rank_batches(t), seeds=seeds)]
    return torch.cat(out)


@pytest.mark.slow  # the splits' fixture (~1.8 s) included
def test_augmentation_is_the_same_on_every_layout_and_after_a_resume(splits):
    """320 training images, 3 steps of 32: 2 processes x 16, 1 process accumulating 2 x 16,
    1 x 32, and a run resumed at step 1 augment every sample alike, bitwise."""
    t = splits.train
    sub = data.DeviceImages(t.images[:320], t.labels[:320], MEAN, STD, True, t.classes, 3)
    ref = _augmented(sub, 1, 16, 0, 3)
    assert torch.equal(_augmented(sub, 2, 16, 0, 3), ref)
    assert torch.equal(_augmented(sub, 1, 32, 0, 3), ref)
    resumed = torch.cat([_augmented(sub, 1, 16, 0, 1), _augmented(sub, 1, 16, 1, 3)])
    assert torch.equal(resumed, ref)
    # ... and there is augmentation to agree on: most samples are not their plain image
    plain = data.DeviceImages(t.images[:320], t.labels[:320], MEAN, STD, False, t.classes, 3)
    order = torch.cat(
        [
            data.StepSampler(
                num_samples=320,
                batch_size=32,
                micro_batch=32,
                rank=0,
                world_size=1,
                seed=0,
                total_steps=3,
            ).global_batch(s)
            for s in range(3)
        ]
    )
    moved = (ref != plain.batch(order)[0]).flatten(1).any(1).float().mean().item()
    assert moved > 0.8  # 1 - P(no shift, no flip) = 1 - 1/162


# -- refusals: one line naming the file (or data_dir) and how to get the real files ------------


def _refused(path: Path, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        fashion_mnist.read(path, TRAIN_LABELS)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path)), message
    for w in [*words, "apt-get install dataset-fashion-mnist", "lbsgd data fetch"]:
        assert w in message, message


@pytest.mark.parametrize(
    ("name", "damage", "words"),
    [
        ("a.gz", lambda raw: gzip.compress(raw)[:5000], ["not a whole gzip file"]),
        ("a", lambda raw: raw[:1000], ["is truncated", "1,000 bytes", "60,008 expected"]),
        ("a.gz", lambda raw: gzip.compress(b"<html>404</html>"), ["not an IDX file", "0x3c68746d"]),
        ("a", lambda raw: raw[:7] + b"\x5f" + raw[8:], ["has dimensions (59999,)"]),
        ("a", lambda raw: raw + b"\0", ["has trailing bytes", "60,009 bytes"]),
        ("a", lambda raw: raw[:100] + bytes([raw[100] ^ 1]) + raw[101:], ["sha256", "bad3541b"]),
        ("a.gz", lambda raw: gzip.compress(raw[:100] + b"\0" + raw[101:]), ["sha256"]),
    ],
    ids=["gz cut", "cut", "foreign", "dimensions", "longer", "one bit", "one byte, gz"],
)
def test_a_truncated_foreign_or_altered_file_is_refused_in_one_line_naming_it(
    fashion_mnist_dir, tmp_path, name, damage, words
):
    raw = gzip.decompress((fashion_mnist_dir / f"{TRAIN_LABELS.name}.gz").read_bytes())
    (tmp_path / name).write_bytes(damage(raw))
    _refused(tmp_path / name, words)


def test_missing_files_name_data_dir_what_is_missing_and_the_two_ways_to_get_them(tmp_path):
    ways = ["apt-get install dataset-fashion-mnist", "lbsgd data fetch fashion_mnist"]
    with pytest.raises(FileNotFoundError) as err:
        fashion_mnist.check(tmp_path / "nowhere")
    assert f"data_dir='{tmp_path / 'nowhere'}' does not exist" in str(err.value)
    for name in NAMES[:3]:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(FileNotFoundError) as err:
        fashion_mnist.check(tmp_path)
    message = str(err.value)
    assert message.startswith(f"data_dir='{tmp_path}' lacks t10k-labels-idx1-ubyte (")
    assert "\n" not in message and all(w in message for w in ways), message


def test_the_default_data_dir_is_debians_folder_else_data_fashion_mnist(tmp_path, monkeypatch):
    assert fashion_mnist.default_dir() == (
        fashion_mnist.DEBIAN_DIR
        if fashion_mnist.DEBIAN_DIR.is_dir()
        else Path("data/fashion_mnist")
    )
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.chdir(tmp_path)
    assert fashion_mnist.default_dir() == Path("data/fashion_mnist")
    with pytest.raises(FileNotFoundError, match=r"^data_dir=null \(the default, here 'data/fas"):
        fashion_mnist.check(None)


def test_missing_real_files_skip_saying_how_to_get_them_and_fail_under_ci(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pytest.skip.Exception, match="apt-get install dataset-fashion-mnist"):
        real_fashion_mnist(ci=False)
    with pytest.raises(pytest.fail.Exception, match="^CI=true and the real Fashion-MNIST"):
        real_fashion_mnist(ci=True)


# -- lbsgd data fetch fashion_mnist DIR: torchvision's download, its layout read -----------------


class _Torchvision:
    """torchvision.datasets.FashionMNIST(root, download=True) without the network: the files it
    writes (root/FashionMNIST/raw/: each .gz and its decompressed file) from ``source``."""

    calls: list = []

    def __init__(self, root: str, download: bool = False, source: Path | None = None) -> None:
        self.calls.append((root, download))
        raw = Path(root) / "FashionMNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for name in NAMES:
            shutil.copyfile(source / f"{name}.gz", raw / f"{name}.gz")
            (raw / name).write_bytes(gzip.decompress((source / f"{name}.gz").read_bytes()))


def _fetch(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = cli.main(["data", "fetch", *argv])
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


@pytest.mark.slow  # the splits' fixture (~1.8 s) included
def test_fetch_puts_torchvisions_layout_in_dir_which_reads_as_the_gzipped_files(
    splits, fashion_mnist_dir, tmp_path, monkeypatch, capsys
):
    import torchvision.datasets

    calls: list = []

    def download(root, download=False):
        _Torchvision.calls = calls
        return _Torchvision(root, download, fashion_mnist_dir)

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", download)
    dest = tmp_path / "fm"
    code, out, err = _fetch(capsys, ["fashion_mnist", str(dest)])
    assert (code, err) == (0, "") and calls == [(str(dest), True)]
    assert out.endswith(f"dataset=fashion_mnist data_dir={dest}")
    train, test, _, _ = fashion_mnist.fashion_mnist(dest)  # uncompressed, FashionMNIST/raw/
    assert torch.equal(train.images, splits.train.images)
    assert torch.equal(test.labels, splits.test.labels)
    code, out, err = _fetch(capsys, ["fashion_mnist", str(dest)])  # held already: no download
    assert code == 0 and len(calls) == 1


def test_fetch_refuses_a_file_and_says_so_when_the_download_fails(tmp_path, monkeypatch, capsys):
    import torchvision.datasets

    (tmp_path / "afile").write_text("x")
    code, out, err = _fetch(capsys, ["fashion_mnist", str(tmp_path / "afile")])
    assert (code, out) == (2, "") and err.count("\n") == 0
    assert (
        err
        == f"lbsgd: error: DIR='{tmp_path / 'afile'}' exists and is not a folder (valid: a folder path)"
    )

    def offline(root, download=False):
        raise RuntimeError("Error downloading a.gz:\nTried http://m/, got:\n<urlopen error>")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    code, out, err = _fetch(capsys, ["fashion_mnist", str(tmp_path / "new")])
    assert code == 1 and err.count("\n") == 0, err
    assert "Tried http://m/, got: <urlopen error>" in err
    assert err.endswith("without internet: apt-get install dataset-fashion-mnist")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["data", "fetch", "mnist", str(tmp_path)])
    assert exit_.value.code == 2


# -- fashion_size and fashion_train: smaller images, fewer of them ------------------------------


def _block_means(images: np.ndarray, block: int) -> np.ndarray:
    """uint8 (N, 28, 28) -> the mean of each block x block square, rounded half to even, by hand:
    integer sums, then numpy's round of the float64 quotient (exact: a sum over block^2 pixels)."""
    n, side = len(images), 28 // block
    sums = images.astype(np.int64).reshape(n, side, block, side, block).sum(axis=(2, 4))
    return np.round(sums / block**2).astype(np.uint8)


def test_downsampling_is_the_block_means_rounded_half_to_even_and_torchs_area_pooling():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(300, 28, 28), dtype=np.uint8)
    for size in (14, 7, 4):  # the divisors of 28 in range: blocks of 2, 4, 7
        assert np.array_equal(
            fashion_mnist.downsample(images, size), _block_means(images, 28 // size)
        )
    # ties (a 2x2 sum of 2 mod 4: a mean of m + 1/2) are there, and go to the even neighbour
    sums = images.astype(np.int64).reshape(300, 14, 2, 14, 2).sum(axis=(2, 4))
    assert (sums % 4 == 2).mean() > 0.2
    assert not np.array_equal(np.floor(sums / 4 + 0.5).astype(np.uint8), _block_means(images, 2))
    for size in (5, 9, 13, 27):  # not divisors: torch's adaptive (area) pooling, in float64
        pooled = torch.nn.functional.adaptive_avg_pool2d(
            torch.from_numpy(images).double().unsqueeze(1), size
        )
        expected = torch.round(pooled)[:, 0].to(torch.uint8).numpy()
        assert np.array_equal(fashion_mnist.downsample(images, size), expected), size
    assert fashion_mnist.downsample(images, 28) is images  # 28: as they are


@pytest.fixture(scope="module")
def small(fashion_mnist_dir):
    """fashion_size=14, fashion_train=20000 as a run builds it, on the CPU."""
    cfg = Config(dataset="fashion_mnist", fashion_size=14, fashion_train=20_000, device="cpu")
    return data.build(cfg, torch.device("cpu"))


def _first_of_each_class(labels: np.ndarray, per_class: int) -> list[int]:
    """The indices of the first ``per_class`` images of each class, reading the labels in order."""
    seen, keep = [0] * 10, []
    for i, label in enumerate(labels.tolist()):
        if seen[label] < per_class:
            seen[label] += 1
            keep.append(i)
    return keep


@pytest.mark.slow  # its fixture (~1.1 s) and two IDX files read by hand
def test_fashion_train_is_the_first_tenth_of_each_class_in_file_order_at_fashion_size(
    small, fashion_mnist_dir
):
    keep = _first_of_each_class(_idx(fashion_mnist_dir, "train-labels-idx1-ubyte"), 2_000)
    train = _idx(fashion_mnist_dir, "train-images-idx3-ubyte")[keep]
    assert torch.bincount(small.train.labels, minlength=10).tolist() == [2_000] * 10
    assert (
        small.train.labels.tolist()
        == _idx(fashion_mnist_dir, "train-labels-idx1-ubyte")[keep].tolist()
    )
    assert np.array_equal(small.train.images[:, 0].numpy(), _block_means(train, 2))
    # the test split stays whole, downsampled alike
    test = _idx(fashion_mnist_dir, "t10k-images-idx3-ubyte")
    assert np.array_equal(small.test.images[:, 0].numpy(), _block_means(test, 2))
    assert len(small.test) == 10_000 and small.image_size == 14


def test_the_statistics_are_the_used_training_images_and_the_batches_standardise_with_them(small):
    pixels = small.train.images.numpy().astype(np.float64) / 255
    mean, std = round(pixels.mean(), 4), round(pixels.std(), 4)
    assert small.train.mean == small.test.mean == (mean,)
    assert small.train.std == small.test.std == (std,)
    assert std < STD[0] - 0.01  # area averaging lowers the std: 28x28's would not standardise
    x, _ = data.batches(small.test, [torch.tensor([0, 7])]).__next__()
    hand = (small.test.images[[0, 7]].double() / 255 - mean) / std
    torch.testing.assert_close(x, hand.expand(-1, 3, -1, -1).float(), rtol=0, atol=1e-5)
    net = models.build(Config(model="resnet", depth=8, width=8), 10, small.image_size)
    assert tuple(net(x).shape) == (2, 10)


def test_the_padding_scales_with_the_size_two_pixels_at_14(small):
    assert [fashion_mnist.pad_for(s) for s in (28, 14, 7, 4)] == [4, 2, 1, 1]
    assert small.train.pad == small.train.to(torch.device("cpu")).pad == 2
    idx, seeds = torch.arange(400), data.sample_seeds(3, torch.arange(400))
    x, _ = small.train.batch(idx, seeds)
    top, left, flip = placements(seeds, span=5)  # offsets 0 .. 4: pad 2 each side
    assert sorted(set(top.tolist())) == [0, 1, 2, 3, 4]
    by_hand = pad_crop_flip(small.train.images[idx], top, left, flip, pad=2)
    plain = data.DeviceImages(
        by_hand, small.train.labels[idx], small.train.mean, small.train.std, False
    )
    assert torch.equal(x, plain.batch(torch.arange(400))[0].expand(-1, 3, -1, -1))


def test_the_shape_and_memory_known_before_reading_follow_the_keys():
    cfg = Config(dataset="fashion_mnist", fashion_size=14, fashion_train=20_000)
    assert data.shape_of(cfg) == (10, 14)
    assert data.memory_need(cfg) == (30_000 * 14 * 14, ("fashion_train", "fashion_size"))
    assert data.shape_of(Config(dataset="fashion_mnist")) == (10, 28)


@pytest.mark.parametrize(
    ("key", "bad", "good", "valid"),
    [
        ("fashion_size", [0, 3, 29, -14], [4, 13, 28], "must be an integer from 4 to 28"),
        (
            "fashion_train",
            [0, 5, 15, 59_999, 60_010, -10],
            [10, 20_000, 60_000],
            "must be a multiple of 10 from 10 to 60000",
        ),
    ],
)
def test_a_size_or_training_count_out_of_range_is_refused_in_one_line_naming_it(
    key, bad, good, valid
):
    for value in bad:
        with pytest.raises(ConfigError) as err:
            config.from_dict({"dataset": "fashion_mnist", key: value})
        message = str(err.value)
        assert message.startswith(f"{key}={value} {valid}") and "\n" not in message, message
    for value in good:
        assert getattr(config.from_dict({key: value}), key) == value


def test_a_run_with_the_defaults_keeps_its_name_and_others_are_told_apart():
    # the names before fashion_size and fashion_train existed (experiment ids pinned then)
    assert (
        Config(dataset="fashion_mnist").run_name()
        == "resnet20-fashion_mnist-b256-gradual-s0-1d4daf5a"
    )
    assert Config(dataset="fashion_mnist", fashion_size=28, fashion_train=60_000).run_name() == (
        "resnet20-fashion_mnist-b256-gradual-s0-1d4daf5a"
    )
    ids = {
        Config(dataset="fashion_mnist", **keys).experiment_id()
        for keys in (
            {},
            {"fashion_size": 14},
            {"fashion_train": 20_000},
            {"fashion_size": 14, "fashion_train": 20_000},
        )
    }
    assert len(ids) == 4
    assert Config(fashion_size=14).to_dict()["fashion_size"] == 14  # W&B's config is this dict
