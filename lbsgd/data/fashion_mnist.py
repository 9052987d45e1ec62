"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747) read from its four IDX files.

Each file is checked whole (magic number, dimensions, sha256 of its decompressed contents: Debian's
recompressed ``.gz`` files decompress to the original's bytes) before any work, and a damaged one is
refused in one line naming it. The splits are :class:`~lbsgd.data.device_images.DeviceImages` like
CIFAR-10's; the one channel is held as uint8 and a batch leaves as 3 equal channels, so every
built-in RGB model takes it as it is. ``fashion_size`` (:func:`downsample`) and ``fashion_train``
(:func:`first_of_each_class`) size a run for a small budget; docs/datasets.md has the layouts."""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lbsgd.data.device_images import DeviceImages

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")  # apt-get install dataset-fashion-mnist
LOCAL_DIR = Path("data/fashion_mnist")  # under the working directory, kept out of git
TORCHVISION_RAW = Path("FashionMNIST", "raw")  # torchvision's root/<class name>/raw

# Pixel mean and standard deviation over all 47,040,000 pixels of the 60,000 training images,
# scaled to [0, 1] (recompute: the train-images file's bytes after its 16-byte header, / 255,
# .mean() and .std(): 0.286041 and 0.353024).
MEAN = (0.2860,)
STD = (0.3530,)

# The class names by label (the dataset's README).
CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
IMAGE_SIZE = 28
TRAIN_SIZE = 60_000

HOWTO = (
    "Fashion-MNIST's four IDX files, .gz or not; get them with `apt-get install "
    f"dataset-fashion-mnist` (into {DEBIAN_DIR}, the default data_dir) or `lbsgd data fetch "
    "fashion_mnist DIR` (torchvision's download into DIR, needs internet)"
)


@dataclass(frozen=True)
class IdxFile:
    """One IDX file of unsigned bytes: its name, dimensions and the sha256 of its decompressed
    contents (header included; both releases, upstream commit 55506a9)."""

    name: str
    shape: tuple[int, ...]
    sha256: str

    @property
    def magic(self) -> int:
        """0x0000 08 nd: two zero bytes, type 0x08 (unsigned byte), the number of dimensions."""
        return 0x0800 + len(self.shape)

    @property
    def size(self) -> int:
        """Bytes decompressed: the 4-byte magic number, 4 bytes per dimension, the data."""
        return 4 + 4 * len(self.shape) + int(np.prod(self.shape))


FILES = {
    "train": (
        IdxFile(
            "train-images-idx3-ubyte",
            (60_000, 28, 28),
            "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        ),
        IdxFile(
            "train-labels-idx1-ubyte",
            (60_000,),
            "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        ),
    ),
    "test": (
        IdxFile(
            "t10k-images-idx3-ubyte",
            (10_000, 28, 28),
            "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        ),
        IdxFile(
            "t10k-labels-idx1-ubyte",
            (10_000,),
            "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        ),
    ),
}


ALL_FILES = tuple(f for split in FILES.values() for f in split)


def default_dir() -> Path:
    """Debian's folder where it exists, else ``data/fashion_mnist`` under the working directory."""
    return DEBIAN_DIR if DEBIAN_DIR.is_dir() else LOCAL_DIR


def _named(data_dir: str | os.PathLike | None) -> str:
    if data_dir is None:
        return f"data_dir=null (the default, here '{default_dir()}')"
    return f"data_dir='{data_dir}'"


def locate(data_dir: str | os.PathLike | None) -> dict[str, Path]:
    """The path of each of the four files under ``data_dir`` (None: :func:`default_dir`), by name:
    the first of NAME, NAME.gz, FashionMNIST/raw/NAME, FashionMNIST/raw/NAME.gz that is a file.
    FileNotFoundError in one line naming data_dir, what is missing and how to get it."""
    folder = default_dir() if data_dir is None else Path(data_dir).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{_named(data_dir)} does not exist or is not a directory ({HOWTO})"
        )
    found, absent = {}, []
    for spec in ALL_FILES:
        candidates = [
            where / (spec.name + ext)
            for where in (folder, folder / TORCHVISION_RAW)
            for ext in ("", ".gz")
        ]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            absent.append(spec.name)
        else:
            found[spec.name] = path
    if absent:
        raise FileNotFoundError(f"{_named(data_dir)} lacks {', '.join(absent)} ({HOWTO})")
    return found


def _problem(raw: bytes, spec: IdxFile) -> str | None:
    """What is wrong with the decompressed ``raw`` as ``spec``'s file; None when nothing is."""
    header = 4 + 4 * len(spec.shape)
    if len(raw) < 4 or int.from_bytes(raw[:4], "big") != spec.magic:
        got = f"0x{int.from_bytes(raw[:4], 'big'):08x}" if len(raw) >= 4 else "none"
        return (
            f"is not an IDX file of unsigned bytes in {len(spec.shape)} dimension(s) "
            f"(magic number {got}, expected 0x{spec.magic:08x})"
        )
    if len(raw) < header:
        return f"is truncated: {len(raw):,} bytes, {spec.size:,} expected"
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(len(spec.shape)))
    if shape != spec.shape:
        return f"has dimensions {shape}, Fashion-MNIST's are {spec.shape}"
    if len(raw) != spec.size:
        cut = "is truncated" if len(raw) < spec.size else "has trailing bytes"
        return f"{cut}: {len(raw):,} bytes, {spec.size:,} expected (decompressed)"
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec.sha256:
        return (
            f"is damaged or another dataset's: sha256 of its decompressed contents is "
            f"{digest[:16]}…, Fashion-MNIST's is {spec.sha256[:16]}…"
        )
    return None


def read(path: Path, spec: IdxFile) -> np.ndarray:
    """The uint8 array of ``spec``'s file at ``path`` (gzipped when its name ends in .gz), its
    magic number, dimensions, length and digest checked; ValueError in one line naming ``path``."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # cut short, or not gzip at all
        raise ValueError(f"{path} is not a whole gzip file ({e}) ({HOWTO})") from None
    problem = _problem(raw, spec)
    if problem:
        raise ValueError(f"{path} {problem} ({HOWTO})")
    header = 4 + 4 * len(spec.shape)
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(spec.shape)


def _read_all(data_dir: str | os.PathLike | None) -> dict[str, np.ndarray]:
    paths = locate(data_dir)
    out = {}
    for spec in ALL_FILES:
        try:
            out[spec.name] = read(paths[spec.name], spec)
        except ValueError as e:
            raise ValueError(f"{_named(data_dir)}: {e}") from None
    return out


def check(data_dir: str | os.PathLike | None) -> None:
    """Every check :func:`fashion_mnist` makes of the files, before any work (each file is read
    and digested: ~0.5 s, decompression mostly). FileNotFoundError or ValueError in one line."""
    _read_all(data_dir)


def downsample(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, 28, 28) images area-averaged to (N, size, size): torch's adaptive average pooling
    (output pixel (i, j) the mean of rows floor(28i/size) .. ceil(28(i+1)/size) - 1 and likewise
    columns; for a divisor of 28, the mean of a (28/size)^2 block), rounded half to even; ``size``
    28: the images as they are.

    Exact, and the same on every CPU: a window holds k <= 7x7 = 49 pixels (sizes 4 and 5; fewer
    elsewhere), so its sum is an integer below 2^24, exact in float32 in any order of addition, and
    the mean is that sum divided by the window's height then width, each division correctly
    rounded. A mean that is exactly m + 1/2 survives both divisions exactly (S / kh = (m + 1/2) kw
    has at most one bit after the point and is below 2^24); any other mean lies at least 1/(2k) >=
    1/98 from a half-integer, far beyond the divisions' error (~2 ulp of 256 = 3e-5), so rounding
    it gives the integer the exact rational mean rounds to."""
    if size == images.shape[-1]:
        return images
    out = []
    for i in range(0, len(images), 10_000):  # float32 copies of 10,000 images at a time
        chunk = torch.from_numpy(images[i : i + 10_000].astype(np.float32))
        mean = torch.nn.functional.adaptive_avg_pool2d(chunk.unsqueeze(1), size)
        out.append(torch.round(mean)[:, 0].to(torch.uint8))  # torch.round: half to even
    return torch.cat(out).numpy()


def first_of_each_class(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Indices of the first ``per_class`` images of each class of ``labels``, in file order: a
    class-balanced subset that is the same on every machine, and for every ``per_class`` a
    superset of the smaller ones'."""
    picked = [np.flatnonzero(labels == c)[:per_class] for c in range(len(CLASSES))]
    return np.sort(np.concatenate(picked))


def statistics(images: np.ndarray) -> tuple[float, float]:
    """Mean and (population) standard deviation of uint8 ``images``' pixels scaled to [0, 1],
    rounded to 4 decimals as :data:`MEAN`/:data:`STD` are written (which they equal for the 60,000
    training images at 28x28, so a run with the defaults standardises as before). From the pixel
    histogram with integer sums, one correctly rounded division each: exact, the same on every
    machine. Area averaging keeps the mean (up to the rounding to uint8) but lowers the std."""
    counts = np.bincount(images.reshape(-1), minlength=256).astype(np.int64)
    values = np.arange(256, dtype=np.int64)
    n, s1, s2 = int(counts.sum()), int(counts @ values), int(counts @ (values * values))
    mean = s1 / (255 * n)
    var = (n * s2 - s1 * s1) / (255 * n) ** 2  # Python integers: exact up to the division
    return round(mean, 4), round(math.sqrt(var), 4)


def pad_for(size: int) -> int:
    """The augmentation's zero padding at image size ``size``: round(size / 7), at least 1 (4 at
    28, as CIFAR-10's 4 at 32; 2 at 14). size / 7 is never a half-integer: no tie to break."""
    return max(1, round(size / 7))


def fashion_mnist(
    data_dir: str | os.PathLike | None = None,
    augment: bool = True,
    size: int = IMAGE_SIZE,
    train: int = TRAIN_SIZE,
) -> tuple[DeviceImages, DeviceImages, int, int]:
    """Return ``(train, test, num_classes=10, image_size=size)`` for the files under ``data_dir``
    (None: :func:`default_dir`): the first ``train / 10`` training images of each class
    (:func:`first_of_each_class`) and the 10,000 test images, area-averaged to ``size`` x ``size``
    (:func:`downsample`). uint8 (N, 1, size, size) images, int64 labels; batches are 3-channel
    float32 standardised with the :func:`statistics` of the training images kept (at the defaults,
    :data:`MEAN`/:data:`STD`), training ones pad-crop-flip augmented (:func:`pad_for` pixels of
    zero padding, 4 at 28 as CIFAR-10's: zero is the images' black background) unless
    ``augment=False``."""
    arrays = _read_all(data_dir)
    (train_x, train_y), (test_x, test_y) = (
        (arrays[images.name], arrays[labels.name]) for images, labels in FILES.values()
    )
    if train != TRAIN_SIZE:
        keep = first_of_each_class(train_y, train // len(CLASSES))
        train_x, train_y = train_x[keep], train_y[keep]
    train_x, test_x = downsample(train_x, size), downsample(test_x, size)
    mean, std = statistics(train_x)
    splits = []
    for x, y, aug in ((train_x, train_y, augment), (test_x, test_y, False)):
        images = torch.from_numpy(np.ascontiguousarray(x).copy()).unsqueeze(1)  # (N, 1, H, W)
        labels = torch.from_numpy(y.astype(np.int64))
        splits.append(
            DeviceImages(
                images, labels, (mean,), (std,), aug, CLASSES, channels=3, pad=pad_for(size)
            )
        )
    return splits[0], splits[1], len(CLASSES), size


def fetch(dest: str | os.PathLike | None = None) -> Path:
    """Download the four files through torchvision into ``dest`` (None: :data:`LOCAL_DIR`), in
    torchvision's layout (``dest/FashionMNIST/raw/``), and check them; nothing is downloaded
    when ``dest`` already holds them whole. FileExistsError when ``dest`` is a file; RuntimeError
    in one line when the download fails or gives files that are not Fashion-MNIST's."""
    dest = LOCAL_DIR if dest is None else Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"DIR='{dest}' exists and is not a folder (valid: a folder path)")
    try:
        check(dest)
        return dest
    except (FileNotFoundError, ValueError):
        pass
    from torchvision import datasets

    try:
        datasets.FashionMNIST(str(dest), download=True)
    except (OSError, RuntimeError) as e:  # no network, a mirror down, an md5 mismatch
        said = " ".join(str(e).split()) or type(e).__name__  # torchvision's lines, as one
        raise RuntimeError(
            f"could not download Fashion-MNIST into '{dest}' through torchvision ({said}); "
            "without internet: apt-get install dataset-fashion-mnist"
        ) from None
    try:
        check(dest)
    except (FileNotFoundError, ValueError) as e:
        raise RuntimeError(str(e)) from None
    return dest
