"""Ten generated shapes, 16x16 RGB: the embedded default dataset, made from a seed, no download.

The datasets that ship inside Python packages do not fit a large-minibatch study (scikit-learn's
digits is 1,797 images of 8x8, torchvision's FakeData has random labels, the rest needs a
download), so :func:`generate` draws a learnable 10-class problem in numpy, vectorised, in a few
seconds. :func:`load` gives 32,000 train and 5,000 test images (independent draws), standardised
with the train statistics and cached on disk. ``easy`` (the smoke profile's) learns faster."""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

CLASSES: tuple[str, ...] = (
    "disk",
    "ring",
    "filled square",
    "square outline",
    "triangle",
    "plus",
    "X",
    "two bars",
    "half disk",
    "T",
)
DIFFICULTIES = ("easy", "standard")
TRAIN_SEED = 20_170_608  # the train and test seeds differ, so the splits are independent draws
TEST_SEED = 20_170_609
GENERATOR_VERSION = 1  # part of the cache file name: bump it whenever the images change
_CHUNK = 2_000  # samples drawn at once: bounds memory to a few tens of MB at 16x16

# Per difficulty: noise sigma (pixel units, colours in [0, 1]), most clutter strokes, largest
# rotation (degrees), scale range (fraction of the frame).
_DIFFICULTY = {
    "easy": {"noise": 0.05, "clutter": 0, "rotation": 15.0, "scale": (0.5, 0.9)},
    "standard": {"noise": 0.12, "clutter": 2, "rotation": 30.0, "scale": (0.35, 0.75)},
}
_MIN_COLOUR_DISTANCE = 0.35  # RGB Euclidean, foreground vs background


def _box(x: np.ndarray, y: np.ndarray, hx: float, hy: float) -> np.ndarray:
    """SDF of an axis-aligned box with half-sizes (hx, hy) centred at the origin."""
    qx, qy = np.abs(x) - hx, np.abs(y) - hy
    return np.hypot(np.maximum(qx, 0), np.maximum(qy, 0)) + np.minimum(np.maximum(qx, qy), 0)


def _triangle(x: np.ndarray, y: np.ndarray, r: float) -> np.ndarray:
    """SDF of an upward equilateral triangle with half-side r, centroid at the origin (Quilez)."""
    k = math.sqrt(3.0)
    x, y = np.abs(x) - r, y + r / k
    fold = x + k * y > 0
    x, y = np.where(fold, (x - k * y) / 2, x), np.where(fold, (-k * x - y) / 2, y)
    x = x - np.clip(x, -2 * r, 0)
    return -np.hypot(x, y) * np.sign(y)


def _rotated_box(x: np.ndarray, y: np.ndarray, deg: float) -> np.ndarray:
    """A 0.2 x 0.9 half-size bar turned deg degrees from vertical (one arm of the X)."""
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return _box(c * x - s * y, s * x + c * y, 0.2, 0.9)


# Shape SDFs in shape space, where every shape fits (about) inside the unit disk.
_SHAPES = (
    lambda x, y: np.hypot(x, y) - 0.9,  # disk
    lambda x, y: np.abs(np.hypot(x, y) - 0.7) - 0.22,  # ring
    lambda x, y: _box(x, y, 0.7, 0.7),  # filled square
    lambda x, y: np.abs(_box(x, y, 0.56, 0.56)) - 0.15,  # square outline
    lambda x, y: _triangle(x, y, 0.82),  # triangle, circumradius 0.95
    lambda x, y: np.minimum(_box(x, y, 0.88, 0.22), _box(x, y, 0.22, 0.88)),  # plus
    lambda x, y: np.minimum(_rotated_box(x, y, 30), _rotated_box(x, y, -30)),  # X
    lambda x, y: np.minimum(_box(x, y - 0.42, 0.85, 0.2), _box(x, y + 0.42, 0.85, 0.2)),  # =
    lambda x, y: np.maximum(np.hypot(x, y + 0.4) - 0.9, -(y + 0.4)),  # half disk, flat side down
    lambda x, y: np.minimum(_box(x, y - 0.5, 0.75, 0.2), _box(x, y + 0.2, 0.2, 0.6)),  # T
)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")


def _check(difficulty: str, noise: float | None, image_size: int) -> float:
    """Validate the shared arguments; return the noise sigma to use."""
    if difficulty not in _DIFFICULTY:
        raise ValueError(f"difficulty={difficulty!r} is not one of {', '.join(DIFFICULTIES)}")
    _check_int("image_size", image_size, 4)
    if noise is None:
        return _DIFFICULTY[difficulty]["noise"]
    if (
        isinstance(noise, bool)
        or not isinstance(noise, (int, float, np.floating))
        or not 0 <= noise < math.inf
    ):
        raise ValueError(f"noise={noise!r} must be None or a finite number >= 0")
    return float(noise)


def _render(
    rng: np.random.Generator, labels: np.ndarray, cfg: dict, sigma: float, size: int
) -> np.ndarray:
    """Draw one chunk of images (m, 3, size, size) float32 for the given labels."""
    m, pixel = len(labels), 2.0 / size  # pixel: frame units per pixel
    centres = (np.arange(size, dtype=np.float32) + 0.5) * pixel - 1
    px, py = centres[None, None, :], -centres[None, :, None]  # (1, H, W) after broadcast; y up

    # Colours: redraw the pairs that are too close until none is left (deterministic loop).
    fg, bg = rng.random((m, 3)), rng.random((m, 3))
    while (bad := np.linalg.norm(fg - bg, axis=1) < _MIN_COLOUR_DISTANCE).any():
        fg[bad], bg[bad] = rng.random((bad.sum(), 3)), rng.random((bad.sum(), 3))
    grad = rng.uniform(-0.1, 0.1, (m, 3, 2))  # colour change per half-frame along x, y
    img = bg[:, :, None, None] + grad[..., 0, None, None] * px + grad[..., 1, None, None] * py
    img = np.clip(img, 0, 1)  # a valid colour everywhere before the noise

    # Clutter: up to cfg["clutter"] thin segments, each kept only if its index < the drawn count.
    count = rng.integers(0, cfg["clutter"] + 1, m)
    for k in range(cfg["clutter"]):
        a, b = rng.uniform(-1, 1, (m, 2)), rng.uniform(-1, 1, (m, 2))
        half_width = rng.uniform(0.3, 0.7, m) * pixel
        colour = rng.random((m, 3))
        ax, ay, dx, dy = (
            v[:, None, None] for v in (a[:, 0], a[:, 1], b[:, 0] - a[:, 0], b[:, 1] - a[:, 1])
        )
        t = np.clip(((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy + 1e-12), 0, 1)
        dist = np.hypot(px - ax - t * dx, py - ay - t * dy) - half_width[:, None, None]
        cover = np.clip(0.5 - dist / pixel, 0, 1) * (k < count)[:, None, None]
        img += (colour[:, :, None, None] - img) * cover[:, None]

    # Shape pose: radius r (frame units), aspect, rotation, translation keeping it in the frame.
    r = rng.uniform(*cfg["scale"], m)
    aspect = np.exp(rng.uniform(-0.25, 0.25, m))
    theta = np.radians(rng.uniform(-cfg["rotation"], cfg["rotation"], m))
    cos, sin = np.cos(theta), np.sin(theta)
    # Half-extents of the rotated ellipse with semi-axes r*aspect (x) and r/aspect (y).
    ex = r * np.sqrt((aspect * cos) ** 2 + (sin / aspect) ** 2)
    ey = r * np.sqrt((aspect * sin) ** 2 + (cos / aspect) ** 2)
    tx = rng.uniform(-1, 1, m) * np.maximum(1 - ex, 0)
    ty = rng.uniform(-1, 1, m) * np.maximum(1 - ey, 0)
    # Frame -> shape space: undo translation, rotation, then aspect and scale.
    fx, fy = px - tx[:, None, None], py - ty[:, None, None]
    c, s = cos[:, None, None], sin[:, None, None]
    u = (c * fx + s * fy) / (r * aspect)[:, None, None]
    v = (-s * fx + c * fy) * (aspect / r)[:, None, None]
    sdf = np.empty((m, size, size))
    for cls, shape in enumerate(_SHAPES):
        idx = labels == cls
        sdf[idx] = shape(u[idx], v[idx])
    cover = np.clip(0.5 - sdf * r[:, None, None] / pixel, 0, 1)  # shape-space distance x r: frame
    img += (fg[:, :, None, None] - img) * cover[:, None]

    noise = rng.standard_normal((m, 3, size, size), dtype=np.float32)  # drawn even at sigma 0
    return img.astype(np.float32) + np.float32(sigma) * noise


def generate(
    n: int,
    seed: int,
    difficulty: str = "standard",
    noise: float | None = None,
    image_size: int = 16,
) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 (n, 3, H, W) un-standardised, labels int64 (n,)), bitwise deterministic
    given the arguments (numpy's PCG64 seeded with ``seed``).

    The frame is [-1, 1]^2, y up. Each class (:data:`CLASSES`) is a signed distance function drawn
    with a one-pixel anti-aliasing ramp; the X's arms are ±30° from vertical, so that no rotation
    makes a plus of it. Per sample: scale, aspect exp(U(−0.25, 0.25)), rotation and a translation
    that keeps the shape inside the frame; foreground and background colours at least 0.35 apart
    (RGB), a background gradient of U(−0.1, 0.1) per channel, 0-2 clutter strokes under the shape,
    then Gaussian pixel noise, not clipped (:data:`_DIFFICULTY` per difficulty; ``noise``
    overrides its sigma, a monotone difficulty dial: a small ResNet measured about 5% test error
    at 0.10, 8-10% at 0.12, 20% at 0.14, 41% at 0.18). Labels are balanced (n // 10 per class,
    the remainder to the first classes) in a shuffled order.
    """
    _check_int("n", n, 1)
    _check_int("seed", seed, 0)
    sigma = _check(difficulty, noise, image_size)
    rng = np.random.Generator(np.random.PCG64(seed))
    labels = rng.permutation(np.arange(n, dtype=np.int64) % len(CLASSES))
    images = np.empty((n, 3, image_size, image_size), dtype=np.float32)
    for start in range(0, n, _CHUNK):
        chunk = labels[start : start + _CHUNK]
        images[start : start + len(chunk)] = _render(
            rng, chunk, _DIFFICULTY[difficulty], sigma, image_size
        )
    return images, labels


def _read(path: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the file is missing, unreadable or not what we expect."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in shapes}
        dtypes = {k: np.float32 if k.startswith("x") else np.int64 for k in shapes}
        if all(arrays[k].shape == shapes[k] and arrays[k].dtype == dtypes[k] for k in shapes):
            return arrays
        problem = "unexpected shapes or dtypes"
    except Exception as err:  # a torn or foreign file can fail in many ways (zip, header, key)
        problem = f"{type(err).__name__}: {err}"
    warnings.warn(f"regenerating unreadable synthetic cache {path} ({problem})", stacklevel=3)
    return None


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically: a temp file in the same folder, then os.replace over the final name."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a shared cache should be readable
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as err:  # an unwritable cache costs a regeneration next time, not the run
        warnings.warn(f"could not cache synthetic data at {path} ({err})", stacklevel=3)


def load(
    train_size: int = 32_000,
    test_size: int = 5_000,
    difficulty: str = "standard",
    noise: float | None = None,
    image_size: int = 16,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x_train, y_train, x_test, y_test: float32 NCHW standardised with the train statistics, int64.

    Cached un-standardised under cache_dir (default $LBSGD_CACHE or ~/.cache/lbsgd)/synthetic.
    """
    _check_int("train_size", train_size, 1)
    _check_int("test_size", test_size, 1)
    sigma = _check(difficulty, noise, image_size)
    root = cache_dir or os.environ.get("LBSGD_CACHE") or Path.home() / ".cache" / "lbsgd"
    name = (
        f"shapes-v{GENERATOR_VERSION}-{difficulty}-noise{sigma!r}-size{image_size}"
        f"-train{train_size}s{TRAIN_SEED}-test{test_size}s{TEST_SEED}.npz"
    )
    path = Path(root).expanduser() / "synthetic" / name
    img = (3, image_size, image_size)
    shapes = {
        "x_train": (train_size, *img),
        "y_train": (train_size,),
        "x_test": (test_size, *img),
        "y_test": (test_size,),
    }
    arrays = _read(path, shapes)
    if arrays is None:
        x_train, y_train = generate(train_size, TRAIN_SEED, difficulty, sigma, image_size)
        x_test, y_test = generate(test_size, TEST_SEED, difficulty, sigma, image_size)
        arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
        _write(path, arrays)
    # Per-channel statistics over the train split only, in float64 (8M values per channel), one
    # channel at a time and applied in float32 so the peak memory stays near two copies of the data.
    x_train, x_test = arrays["x_train"], arrays["x_test"]
    mean = np.array([x_train[:, c].mean(dtype=np.float64) for c in range(3)])
    std = np.array([x_train[:, c].std(dtype=np.float64) for c in range(3)])
    mean = mean.astype(np.float32)[None, :, None, None]
    inv_std = (1 / std).astype(np.float32)[None, :, None, None]
    x_train, x_test = (x_train - mean) * inv_std, (x_test - mean) * inv_std
    return (
        torch.from_numpy(x_train),
        torch.from_numpy(arrays["y_train"]),
        torch.from_numpy(x_test),
        torch.from_numpy(arrays["y_test"]),
    )
