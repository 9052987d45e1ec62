"""The one vocabulary of lbsgd: every knob, its default, its validation and the values derived from it.

Three kinds of keys (``lbsgd keys`` prints them all):

- *experiment* keys define the mathematics of a run exactly as a paper states it (global batch kn,
  BN group size n, learning-rate rule, warmup, schedule, optimizer, model, data, seed). They identify
  a run: two runs with the same experiment keys are the same experiment, whatever the hardware.
- *hardware* keys only say how the run is executed (micro-batch per process, loader workers, DDP
  bucket size, memory format, compilation, device, threads). Gradient accumulation steps are derived:
  ``batch_size / (world_size * micro_batch)``.
- *run* keys say where results go and how the run is tracked.

Defaults are Goyal et al. 2017 (arXiv:1706.02677) §5.1: lr 0.1 per 256 images with the linear rule,
BN groups of n=32, Nesterov momentum 0.9, weight decay 1e-4, 5 epochs of gradual warmup, lr ÷10 at
epochs 30, 60 and 80 of 90, and γ=0 for the last BN of each residual block (§5.3). Only the model and
the data differ: the embedded default is a CIFAR-style ResNet-20 on the generated ``synthetic`` set,
so that ``lbsgd train`` runs anywhere without a download.

Derived values (scaled lr, steps per epoch, warmup steps, accumulation steps, …) are computed here
and nowhere else (:func:`derive`), printed at the start of every run and dumped with the config.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import json
import math
import os
import re
import sys
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic.dataclasses import dataclass


class ConfigError(ValueError):
    """A bad key or value. Its message is one line naming the key and what would be valid."""


def _key(default: Any, kind: str, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"kind": kind, "help": help})


def _exp(default: Any, help: str) -> Any:
    return _key(default, "experiment", help)


def _hw(default: Any, help: str) -> Any:
    return _key(default, "hardware", help)


def _run(default: Any, help: str) -> Any:
    return _key(default, "run", help)


@dataclass(frozen=True, config=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False))
class Config:
    # --- experiment keys: model and data -------------------------------------------------------
    model: str = _exp(
        "resnet", "network: resnet (CIFAR-style, depth 6n+2), resnet18..152, alexnet, alexnet_bn"
    )
    depth: int = _exp(20, "depth of model=resnet: 6n+2 (8, 14, 20, 32, 44, 56, 110)")
    width: int = _exp(16, "channels of the first stage of model=resnet (16 in He et al. 2016)")
    zero_init_residual: bool = _exp(
        True, "gamma=0 for the last BN of each residual block (Goyal §5.3)"
    )
    pool5_bn: bool = _exp(False, "BN after pool5 of model=alexnet/alexnet_bn (Jia et al. 2018)")
    dataset: str = _exp(
        "synthetic",
        "synthetic (generated, no download), cifar10, imagenet, fashion_mnist; fake (random "
        "images of fake_image_size, nothing to learn: throughput measurements, lbsgd bench train)",
    )
    data_dir: str | None = _exp(
        None,
        "folder holding cifar10/imagenet/fashion_mnist (fashion_mnist's null: "
        "/usr/share/datasets/fashion-mnist if it exists, else data/fashion_mnist); "
        "cache folder for synthetic",
    )
    synthetic_train: int = _exp(32_000, "images in the synthetic train split")
    synthetic_test: int = _exp(5_000, "images in the synthetic test split")
    synthetic_difficulty: Literal["easy", "standard"] = _exp(
        "standard",
        "synthetic generator setting: standard (noise 0.12, clutter) or easy (smoke tests)",
    )
    synthetic_noise: float | None = _exp(
        None, "pixel noise sigma of synthetic; null = difficulty's"
    )
    fake_train: int = _exp(
        2_560,
        "images in the fake train split (2,560 at 224x224: 1.5 GB of float32, held on the GPU)",
    )
    fake_test: int = _exp(256, "images in the fake test split")
    fake_image_size: int = _exp(224, "height = width of the fake images (ImageNet: 224)")
    fake_classes: int = _exp(1_000, "classes of the fake labels (ImageNet: 1000)")
    fashion_size: int = _exp(
        28,
        "height = width of dataset=fashion_mnist's images, 4 to 28: 28 as they are, smaller "
        "area-averaged once when the dataset is built (14: each pixel the mean of a 2x2 block)",
    )
    fashion_train: int = _exp(
        60_000,
        "training images of dataset=fashion_mnist, a multiple of 10 up to 60000: the first "
        "fashion_train/10 of each class in file order (the test split stays 10,000)",
    )
    seed: int = _exp(
        0, "seeds the initialisation, the data order and fake's images (same across batch sizes)"
    )
    # --- experiment keys: minibatch and learning rate ------------------------------------------
    batch_size: int = _exp(256, "global minibatch kn: samples per optimizer step over all workers")
    bn_batch: int = _exp(32, "n: samples per BatchNorm group (Goyal: 32 per worker)")
    base_lr: float = _exp(0.1, "eta: learning rate at reference_batch")
    reference_batch: int = _exp(256, "batch at which base_lr is stated (Goyal: 256)")
    lr_scaling: Literal["linear", "sqrt", "none"] = _exp(
        "linear", "peak lr = base_lr * f(batch_size / reference_batch): linear, sqrt or none"
    )
    warmup: Literal["none", "constant", "gradual"] = _exp(
        "gradual", "none; constant (warmup_lr, then the peak); gradual (linear per iteration)"
    )
    warmup_epochs: float = _exp(5.0, "length of the warmup in epochs (Goyal: 5)")
    warmup_lr: float | None = _exp(None, "lr at the start of the warmup; null = base_lr (Goyal)")
    schedule: Literal["step", "poly", "cosine"] = _exp(
        "step", "decay after warmup, evaluated every iteration: step, poly or cosine"
    )
    milestones: tuple[float, ...] = _exp((30.0, 60.0, 80.0), "epochs where schedule=step decays")
    decay_factor: float = _exp(0.1, "lr multiplier at each milestone of schedule=step")
    poly_power: float = _exp(2.0, "power of schedule=poly (2 for LARS, You et al. 2017)")
    epochs: float = _exp(90.0, "training length in epochs (passes over the train split)")
    # --- experiment keys: optimizer ------------------------------------------------------------
    optimizer: Literal["sgd", "lars"] = _exp(
        "sgd", "sgd (lr inside the velocity, Goyal eq. 10) or lars (You et al. 2017, Algorithm 1)"
    )
    momentum: float = _exp(0.9, "momentum m of the velocity update")
    nesterov: bool = _exp(True, "Nesterov momentum (Goyal §5.1)")
    weight_decay: float = _exp(1e-4, "L2 weight decay lambda (beta of LARS)")
    momentum_correction: bool = _exp(
        True, "scale the velocity by lr_{t+1}/lr_t when the lr changes (Goyal §3, eq. 10)"
    )
    lars_eta: float = _exp(0.001, "LARS trust coefficient eta (You et al. 2017: 0.001)")
    decay_bn_bias: bool = _exp(
        False, "weight decay (and LARS adaptation) also on biases and BN gamma/beta; false: Jia"
    )
    # --- experiment keys: numerics -----------------------------------------------------------
    precision: Literal["fp32", "fp16", "bf16"] = _exp(
        "fp32", "fp32; fp16 (autocast, fp32 master weights, dynamic loss scaling); bf16 (autocast)"
    )
    loss_scale: float = _exp(65536.0, "initial dynamic loss scale of precision=fp16 (2^16)")
    # --- experiment keys: communication that changes the mathematics --------------------------
    local_sgd: int = _exp(
        0, "post-local SGD: after the warmup, average parameters every this many steps; 0 = off"
    )
    # --- experiment keys: BMUF, block momentum on local_sgd's blocks (lbsgd.comm.BMUF) ----------
    block_momentum: float = _exp(
        0.0,
        "eta_B of BMUF (Chen & Huo 2016): the block update is eta_B * previous + block_lr * "
        "(averaged model - block start), every local_sgd steps; in [0, 1); needs local_sgd > 0",
    )
    block_lr: float = _exp(
        1.0, "epsilon_B of BMUF: block learning rate (> 0); 1 with block_momentum 0 = local_sgd"
    )
    block_nesterov: bool = _exp(
        True, "BMUF: each block starts from W + eta_B * Delta (Nesterov, NBM); false: from W (CBM)"
    )
    # --- experiment keys: simulated asynchronous SGD, bounded staleness (lbsgd.staleness) -------
    staleness: int = _exp(
        0,
        "tau_max: the update of step t applies gradients computed on the weights of step t - tau "
        "(Lian et al. 2015); 0 = synchronous. Keeps tau_max + 1 copies of the parameters (also "
        "in the checkpoint)",
    )
    staleness_dist: Literal["fixed", "uniform"] = _exp(
        "fixed",
        "fixed: tau = staleness for every step (layout-independent); uniform: tau drawn from "
        "{0..staleness} per micro-batch and step, seeded by (seed, step, micro-batch): the draws "
        "follow micro_batch",
    )
    # --- experiment keys: asynchronous parameter server (lbsgd.parameter_server) ----------------
    async_ps: bool = _exp(
        False,
        "asynchronous SGD under torchrun (>= 2 processes): rank 0 a parameter server applying each "
        "worker's gradient on arrival, ranks 1.. workers without barriers; one update = one "
        "worker's batch_size samples; measured staleness in summary.json; cannot resume",
    )
    # --- hardware keys --------------------------------------------------------------------------
    micro_batch: int | Literal["auto"] | None = _hw(
        None,
        "samples per process per forward/backward; null = bn_batch; auto = the largest multiple "
        "of bn_batch dividing the per-process share that fits the device (probed; see README)",
    )
    workers: int = _hw(
        0,
        "DataLoader worker processes for imagenet and other per-sample datasets "
        "(0: in the main process; in-memory ones, cifar10 included, use none)",
    )
    bucket_cap_mb: float = _hw(25.0, "DDP gradient bucket size in MB (tensor fusion)")
    comm_hook: Literal["none", "fp16", "bf16", "powersgd", "hierarchical", "parameter_server"] = (
        _hw(
            "none",
            "gradient all-reduce: none (DDP's), fp16/bf16 compressed, powersgd, hierarchical "
            "(intra-node, then across nodes), parameter_server (reduce to rank 0, broadcast)",
        )
    )
    powersgd_rank: int = _hw(1, "rank of PowerSGD's low-rank factors (comm_hook=powersgd)")
    channels_last: bool = _hw(False, "channels_last memory format for model and inputs")
    compile: bool = _hw(False, "torch.compile the model")
    device: Literal["auto", "cpu", "cuda"] = _hw("auto", "auto: cuda when available, else cpu")
    backend: Literal["auto", "nccl", "gloo"] = _hw(
        "auto",
        "process group: auto (nccl on cuda, gloo on cpu); gloo on cuda lets processes share a GPU",
    )
    deterministic: bool = _hw(
        False,
        "deterministic algorithms (torch.use_deterministic_algorithms, cuBLAS workspace): bitwise "
        "repeatable GPU runs, slower; CPU runs are deterministic either way",
    )
    threads: int = _hw(0, "torch intra-op threads per process (at most 1024); 0 = torch's default")
    cpu_isa: Literal["native", "portable", "avx2", "avx512_core", "avx512_core_amx"] = _hw(
        "native",
        "cap of the CPU kernels (ATen, oneDNN, MKL), set before torch loads: native (none); "
        "portable (AVX2, oneDNN off, MKL COMPATIBLE: the same digits on Intel and AMD CPUs with "
        "AVX2); avx2, avx512_core, avx512_core_amx (same digits on CPUs of one vendor) (lbsgd.isa)",
    )
    # --- run keys -------------------------------------------------------------------------------
    out_dir: str = _run(
        "results/cli",
        "results root; the run lives in out_dir/study/name (a study's runs: results/<profile>; "
        "git ignores the default, results/cli)",
    )
    study: str = _run("runs", "group of runs (a notebook's study); W&B group")
    name: str | None = _run(
        None, "run name; null = model-dataset-batch-warmup-seed-<experiment hash>"
    )
    profile: str | None = _run(
        None,
        "study scale that produced the run (smoke, cpu, cifar10, imagenet); W&B config and tags",
    )
    varied: tuple[str, ...] = _run(
        (), "the keys this run's study varies; the W&B display name and tags show their values"
    )
    resume: bool = _run(False, "continue the run in out_dir/study/name from its last checkpoint")
    eval_every: int = _run(1, "evaluate every this many epochs (0: only at the end)")
    log_every: int = _run(10, "optimizer steps between metric flushes (one collective per flush)")
    checkpoint: bool = _run(
        True,
        "write checkpoint.pt (previous one kept as checkpoint.prev.pt) every epoch and at the end",
    )
    checkpoint_every: int = _run(
        0, "also write checkpoint.pt every this many optimizer steps (0: epochs and end only)"
    )
    wandb: Literal["auto", "online", "offline", "disabled"] = _run(
        "auto", "W&B mode; auto: online with an API key, else offline"
    )
    wandb_project: str = _run("lbsgd", "W&B project")
    plugins: tuple[str, ...] = _run((), "modules or .py files imported first (register_model, …)")
    noise_scale: bool = _run(
        False,
        "measure the gradient noise scale B_simple = tr(Sigma)/|G|^2 every step from two batch "
        "sizes, noise_scale_batch and batch_size (McCandlish et al. 2018; lbsgd.noise_scale)",
    )
    noise_scale_batch: int | None = _run(
        None,
        "B_small of noise_scale: samples per small batch, consecutive micro-batches of one "
        "process; null = micro_batch (then it follows the layout: set it to compare layouts)",
    )
    noise_scale_ema: float = _run(
        0.99, "decay of the moving averages of |G|^2 and tr(Sigma) whose ratio is B_simple"
    )

    def __post_init__(self) -> None:
        _check(self)

    # -- identity and (de)serialisation --------------------------------------------------------

    def keys_of(self, kind: str) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.metadata["kind"] == kind
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON-ready values (tuples become lists)."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    def experiment_id(self) -> str:
        """Short hash of the experiment keys: equal for runs of the same mathematics.

        Keys of :data:`HASHED_ONLY_OFF_DEFAULT` count only when they differ from their default."""
        keys = {
            k: v
            for k, v in self.keys_of("experiment").items()
            if k not in HASHED_ONLY_OFF_DEFAULT or v != FIELDS[k].default
        }
        text = json.dumps(_plain(keys), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:8]

    def run_name(self) -> str:
        if self.name:
            return self.name
        arch = f"{self.model}{self.depth}" if self.model == "resnet" else self.model
        return f"{arch}-{self.dataset}-b{self.batch_size}-{self.warmup}-s{self.seed}-{self.experiment_id()}"

    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.study / self.run_name()

    def replace(self, **changes: Any) -> Config:
        return from_dict({**self.to_dict(), **changes})


def _plain(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))
FIELDS = {f.name: f for f in dataclasses.fields(Config)}
# Experiment keys added after results were committed: a run's name ends in the hash of its
# experiment keys, so a new key in the hash would rename every earlier run (and make committed
# results look missing). These keys enter the hash only when they differ from their default, which
# is what every earlier run had. Append each new experiment key here; never remove one.
HASHED_ONLY_OFF_DEFAULT: tuple[str, ...] = (
    "fake_train",
    "fake_test",
    "fake_image_size",
    "fake_classes",
)
HASHED_ONLY_OFF_DEFAULT += ("staleness", "staleness_dist")  # lbsgd.staleness
HASHED_ONLY_OFF_DEFAULT += ("async_ps",)  # lbsgd.parameter_server
HASHED_ONLY_OFF_DEFAULT += ("block_momentum", "block_lr", "block_nesterov")  # lbsgd.comm.BMUF
HASHED_ONLY_OFF_DEFAULT += ("fashion_size", "fashion_train")  # lbsgd.data.fashion_mnist


# Linux and macOS file systems hold names of at most 255 bytes; a sweep writes <run name>.log beside
# the run's folder, so a folder name keeps room for that suffix.
MAX_FOLDER_NAME_BYTES = 255 - len(".log")
FOLDER_NAME_RULE = (
    "must be a plain folder name: no '/' or '\\', not '', '.' or '..', no leading "
    "'-', no leading or trailing space, printable characters only, at most "
    f"{MAX_FOLDER_NAME_BYTES} bytes"
)
# W&B's own rule for a project name (wandb.Settings.validate_project): the project is a component
# of every run's URL, entity/project/runs/id, and W&B refuses anything else once the run has started.
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"
WANDB_PROJECT_MAX = 128


def _plain_folder_name(value: Any) -> bool:
    """One path component that stays where it is put: no separator, no '.'/'..', no option-like
    leading '-', no NUL or other unprintable character, no space a listing hides, short enough for
    the file system."""
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and value.isprintable()
        and "/" not in value
        and "\\" not in value
        and not value.startswith("-")
        and value == value.strip()
        and len(value.encode("utf-8", "surrogatepass")) <= MAX_FOLDER_NAME_BYTES
    )


def check_folder_name(key: str, value: Any) -> None:
    """ConfigError (one line naming ``key``) unless ``value`` is one plain path component: what a
    study or run name must be to stay inside ``out_dir``."""
    if not _plain_folder_name(value):
        raise ConfigError(f"{key}={value!r} {FOLDER_NAME_RULE}")


# What would be valid instead, for the key whose folder on the way to a run is not a folder
PLACE_VALID = {
    "out_dir": "a folder, or a path not made yet",
    "study": "another study= or out_dir=",
    "name": "another name= or out_dir=",
}


def check_place(out_dir: str | os.PathLike, study: str, name: str | None = None) -> None:
    """ConfigError (one line naming the key) unless the folder ``out_dir/study[/name]`` can be
    made: every path on the way that exists is a folder (``mkdir`` ends in a traceback on a file),
    and where folders are still to be made, the deepest existing one can be written in. Reads only;
    a run folder that exists is not asked for write access (a completed run is read, not written)."""
    _need(
        isinstance(out_dir, (str, os.PathLike)),
        f"out_dir={out_dir!r} must be a folder path (valid: a str or os.PathLike; got "
        f"{type(out_dir).__name__})",
        ConfigError,
    )
    check_folder_path("out_dir", str(out_dir))
    out = Path(out_dir)
    steps = [("out_dir", p) for p in (*reversed(out.parents), out)] + [("study", out / study)]
    if name is not None:
        steps.append(("name", out / study / name))
    values = {"out_dir": str(out_dir), "study": study, "name": name}
    made = None  # the deepest folder on the way that exists
    for key, path in steps:
        if not os.path.lexists(path):
            _need(
                made is None or os.access(made, os.W_OK | os.X_OK),
                f"out_dir={str(out_dir)!r}: {str(made)!r} cannot be written in (permission "
                f"denied), where {str(steps[-1][1])!r} would be made (valid: a folder you can "
                "write in)",
                ConfigError,
            )
            return
        _need(
            path.is_dir(),
            f"{key}={values[key]!r}: {str(path)!r} exists and is not a folder, so no folder can "
            f"be made there (valid: {PLACE_VALID[key]})",
            ConfigError,
        )
        made = path


# -- each key alone: checked before anything is derived from it ----------------------------------

# The largest float32: lrs, decays, loss scales and noise levels become float32 tensor values
FLOAT32_MAX = 3.4028234663852886e38
# float keys whose value enters float32 arithmetic as it is (the peak lr is checked as derived)
FLOAT32_KEYS = (
    "warmup_lr",
    "weight_decay",
    "lars_eta",
    "loss_scale",
    "block_lr",
    "synthetic_noise",
)
# The largest int64: integer keys become torch's and numpy's int64 values (sizes, counts, seeds)
INT64_MAX = 2**63 - 1
# integer keys that count something: at least one
POSITIVE_KEYS = (
    "batch_size",
    "bn_batch",
    "reference_batch",
    "depth",
    "width",
    "synthetic_train",
    "synthetic_test",
    "fake_train",
    "fake_test",
    "fake_image_size",
    "fake_classes",
    "log_every",
)
# Intra-op threads per process: beyond any CPU node's cores (libgomp aborts at 100,000)
MAX_THREADS = 1024
# The data order's seed of epoch e is seed * SEED_STRIDE + e (lbsgd.data.sampler.permutation)
SEED_STRIDE = 1_000_003
# Epochs stop well before 2^64, the bound of every epoch's data-order seed (with seed 0)
MAX_EPOCHS = 2.0**63
# keys where 0 means "none" or "off" (or is a length, a seed)
NON_NEGATIVE_KEYS = (
    "warmup_epochs",
    "weight_decay",
    "workers",
    "threads",
    "eval_every",
    "bucket_cap_mb",
    "local_sgd",
    "checkpoint_every",
    "seed",
)


def _varied_problem(value: tuple[str, ...]) -> str:
    bad = next(k for k in value if k not in FIELDS and k != "k")
    return f"varied: {bad!r} is not a config key (nor k); `lbsgd keys` lists the vocabulary"


def _wandb_project(value: str) -> bool:
    return 0 < len(value) <= WANDB_PROJECT_MAX and not any(
        ch in value for ch in WANDB_PROJECT_FORBIDDEN
    )


# (key, valid(value), what is wrong: the words after "key=value", or the whole line from the
# value). A key's value of None (where its type allows it) is valid: "off", "the default's".
KEY_RULES: tuple[tuple[str, Any, Any], ...] = (
    *((k, lambda v: v > 0, "must be a positive integer") for k in POSITIVE_KEYS),
    *((k, lambda v: v >= 0, "must be >= 0") for k in NON_NEGATIVE_KEYS),
    ("epochs", lambda v: v > 0, "must be > 0"),
    (
        "epochs",
        lambda v: v <= MAX_EPOCHS,
        f"is too large: epoch e's data order is seeded with seed * {SEED_STRIDE} + e, below 2^64 "
        "(valid: epochs <= 2^63)",
    ),
    # 0: a fixed point (the noise scale of a model as it is, lbsgd.noise_scale)
    ("base_lr", lambda v: v >= 0, "must be >= 0"),
    (
        "threads",
        lambda v: v <= MAX_THREADS,
        "is too large: more than any CPU node has cores, and the OpenMP runtime fails to start "
        f"that many (valid: 0 = torch's default, or 1 … {MAX_THREADS})",
    ),
    ("warmup_lr", lambda v: v > 0, "must be > 0 (or null)"),
    ("momentum", lambda v: 0 <= v < 1, "must be in [0, 1)"),
    ("decay_factor", lambda v: 0 < v <= 1, "must be in (0, 1]"),
    ("poly_power", lambda v: v > 0, "must be > 0"),
    ("lars_eta", lambda v: v > 0, "must be > 0"),
    ("loss_scale", lambda v: v > 0, "must be > 0"),
    ("powersgd_rank", lambda v: v >= 1, "must be a positive integer"),
    ("noise_scale_ema", lambda v: 0 <= v < 1, "must be in [0, 1)"),
    ("noise_scale_batch", lambda v: v > 0, "must be a positive integer (or null)"),
    ("block_momentum", lambda v: 0 <= v < 1, "must be in [0, 1)"),
    ("block_lr", lambda v: v > 0, "must be a finite number > 0"),
    ("staleness", lambda v: v >= 0, "must be >= 0 (0 = synchronous)"),
    ("synthetic_noise", lambda v: v >= 0, "must be >= 0 (or null)"),
    (
        "fashion_size",
        lambda v: 4 <= v <= 28,
        "must be an integer from 4 to 28 (the images' height = width; 28: as they are)",
    ),
    (
        "fashion_train",
        lambda v: 10 <= v <= 60_000 and v % 10 == 0,
        "must be a multiple of 10 from 10 to 60000 (fashion_train/10 images of each class)",
    ),
    (
        "milestones",
        lambda v: all(m >= 0 for m in v) and list(v) == sorted(v),
        "must be non-negative epochs in increasing order",
    ),
    (
        "micro_batch",
        lambda v: v == "auto" or v > 0,
        "must be a positive integer, auto or null",
    ),
    # places the user chooses, absolute or relative, but a path: no NUL, and not empty ('' is
    # the working directory to Path: an unset variable in out_dir=$RESULTS, not a choice)
    *(
        (k, lambda v: "\0" not in v, "holds a NUL character: not a path (valid: a folder path)")
        for k in ("out_dir", "data_dir")
    ),
    ("out_dir", lambda v: v.strip() != "", "is empty (valid: a folder path)"),
    ("data_dir", lambda v: v.strip() != "", "is empty (valid: a folder path, or null)"),
    # nothing is written outside out_dir: each key that becomes a path component under it
    *((k, _plain_folder_name, FOLDER_NAME_RULE) for k in ("study", "name", "profile")),
    (
        "profile",
        lambda v: re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v) is not None,
        "must be null or a plain name (letters, digits, '_', '-', '.')",
    ),
    (
        "wandb_project",
        _wandb_project,
        f"must be a W&B project name: 1 to {WANDB_PROJECT_MAX} characters, none of "
        f"{' '.join(WANDB_PROJECT_FORBIDDEN)}",
    ),
    ("varied", lambda v: all(k in FIELDS or k == "k" for k in v), _varied_problem),
)
_RULES_OF: dict[str, list[tuple[Any, Any]]] = {}
for _k, _ok, _why in KEY_RULES:
    _RULES_OF.setdefault(_k, []).append((_ok, _why))


def _shown(value: Any) -> Any:
    """A value as a message shows it after ``key=``: a list, a quoted string, a number."""
    if isinstance(value, tuple):
        return list(value)
    return repr(value) if isinstance(value, str) else value


def _number_problem(key: str, value: Any) -> str | None:
    """Every float finite (within float32 where it feeds float32 arithmetic as it is), every
    integer within int64."""
    items = value if isinstance(value, tuple) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in items):
        return f"{key}={_shown(value)} must be a finite number"
    if key in FLOAT32_KEYS and abs(value) > FLOAT32_MAX:
        return f"{key}={value:g} overflows float32, where it is used (at most {FLOAT32_MAX:.4g})"
    if any(isinstance(v, int) and v > INT64_MAX for v in items):
        return (
            f"{key}={value} is too large: more than a 64-bit integer holds (valid: {key} <= "
            f"{INT64_MAX})"
        )
    return None


def key_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` for ``key`` alone (a value of the key's type), in one line
    that starts with ``key=value``, or None. No other key is read: these checks come before
    any value is derived from the keys (:func:`_check`, :func:`check_values`)."""
    if value is None:
        return None
    problem = _number_problem(key, value)
    if problem:
        return problem
    for ok, why in _RULES_OF.get(key, ()):
        if not ok(value):
            return why(value) if callable(why) else f"{key}={_shown(value)} {why}"
    return None


_ADAPTERS: dict[str, pydantic.TypeAdapter] = {}


def _typed(key: str, value: Any) -> tuple[Any, str | None]:
    """``value`` as ``key``'s type makes it (the schema's coercion: "8192" -> 8192), or the
    one-line problem with its type."""
    if key not in _ADAPTERS:
        _ADAPTERS[key] = pydantic.TypeAdapter(_hints()[key])
    try:
        return _ADAPTERS[key].validate_python(value), None
    except pydantic.ValidationError as e:
        msgs = dict.fromkeys(err["msg"] for err in e.errors())
        return None, "; ".join(f"{key}={value!r}: {m}" for m in msgs)


def check_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Each key of a raw mapping alone, before anything is derived from it or imported by it (a
    plugin, the CPU cap): known, of its type, in its own range. Returns the values typed by the
    schema; else one ConfigError line naming every bad key and what would be valid."""
    typed: dict[str, Any] = {}
    problems = []
    for key, value in values.items():
        if key not in FIELDS:
            raise ConfigError(unknown_key_message(str(key)))
        typed[key], problem = _typed(key, value)
        problems.append(problem or key_problem(key, typed[key]))
    found = [p for p in problems if p]
    if found:
        raise ConfigError("; ".join(found))
    return typed


def _need(ok: bool, msg: str, error: type[ValueError] = ValueError) -> None:
    # ValueError: pydantic turns it into the validation error that from_dict makes one line of;
    # ConfigError outside a Config's own checks
    if not ok:
        raise error(msg)


def _check(c: Config) -> None:
    """Each key alone first (:func:`key_problem`, every bad key named), then the rules across keys
    and on derived values, each failing with one line that names the key and what would be valid."""
    problems = [p for p in (key_problem(k, getattr(c, k)) for k in KEYS) if p]
    _need(not problems, "; ".join(problems))
    _check_derived(c)
    _check_gradient_rules(c)
    if c.async_ps:
        _check_async_ps(c)
    _check_shapes(c)
    if c.name is None:  # model and dataset (a plugin's registered names) make the run name
        _need(
            _plain_folder_name(c.run_name()),
            f"run name {c.run_name()!r} (from model and dataset) {FOLDER_NAME_RULE}",
        )


def lr_scale(lr_scaling: str, ratio: float) -> float:
    """f(kn / reference_batch) of the learning-rate rule ``lr_scaling`` at ``ratio``."""
    if lr_scaling == "sqrt":
        return math.sqrt(ratio)
    return ratio if lr_scaling == "linear" else 1.0


def _check_derived(c: Config) -> None:
    """Values derived from several keys, each valid alone: the peak lr and the data order's seeds."""
    ratio = c.batch_size / c.reference_batch
    lr = c.base_lr * lr_scale(c.lr_scaling, ratio)
    _need(
        lr <= FLOAT32_MAX,
        f"base_lr={c.base_lr:g} x {c.lr_scaling}(batch_size / reference_batch = {ratio:g}) = "
        f"{lr:.4g} overflows float32, where the lr is used (at most {FLOAT32_MAX:.4g})",
    )
    # torch's generators take seeds below 2^64, and the data order of epoch e is seeded with
    # seed * SEED_STRIDE + e (lbsgd.data.sampler.permutation), for every epoch the run reaches
    last_epoch = math.ceil(c.epochs) + 1
    _need(
        c.seed * SEED_STRIDE + last_epoch < 2**64,
        f"seed={c.seed} is too large: epoch e's data order is seeded with seed * {SEED_STRIDE} + e, "
        f"below 2^64 (valid: seed <= {(2**64 - 1 - last_epoch) // SEED_STRIDE})",
    )


def _check_gradient_rules(c: Config) -> None:
    """Which gradient exchanges combine: the noise scale, local SGD, BMUF and staleness."""
    _need(not c.nesterov or c.momentum > 0, "nesterov=true needs momentum > 0")
    _need(
        not c.noise_scale or c.local_sgd == 0,
        f"noise_scale=true needs the all-reduced gradient of every step: not with "
        f"local_sgd={c.local_sgd} (valid: local_sgd=0)",
    )
    _need(
        not c.noise_scale or c.comm_hook != "powersgd",
        "noise_scale=true measures the exact all-reduced gradient: comm_hook=powersgd only "
        "approximates it (valid: none, fp16, bf16, hierarchical, parameter_server)",
    )
    _need(
        c.local_sgd == 0 or c.comm_hook == "none",
        f"local_sgd={c.local_sgd} averages parameters itself: it needs comm_hook=none, "
        f"not comm_hook={c.comm_hook}",
    )
    # -- BMUF (lbsgd.comm.BMUF) --
    for key, default in (("block_momentum", 0.0), ("block_lr", 1.0), ("block_nesterov", True)):
        _need(
            c.local_sgd > 0 or getattr(c, key) == default,
            f"{key}={getattr(c, key)} filters the blocks of local SGD: it needs local_sgd > 0 "
            f"(the block length n), not local_sgd=0",
        )
    # -- simulated asynchronous SGD (lbsgd.staleness) --
    _need(
        c.staleness == 0 or c.local_sgd == 0,
        f"staleness={c.staleness} delays the gradients of synchronous steps: not with "
        f"local_sgd={c.local_sgd} (valid: local_sgd=0)",
    )


def _check_async_ps(c: Config) -> None:
    """What an asynchronous parameter server (lbsgd.parameter_server) cannot combine with."""
    _need(
        c.local_sgd == 0,
        f"async_ps=true applies each worker's gradient on the server as it "
        f"arrives: not with local_sgd={c.local_sgd} (valid: local_sgd=0)",
    )
    _need(
        c.comm_hook == "none",
        f"async_ps=true sends each gradient to the server point to "
        f"point: not with comm_hook={c.comm_hook} (valid: comm_hook=none)",
    )
    _need(
        not c.noise_scale,
        "noise_scale=true needs the all-reduced gradient of every step: "
        "not with async_ps=true (valid: noise_scale=false)",
    )
    _need(
        c.staleness == 0,
        f"async_ps=true measures real staleness: not with the simulated "
        f"staleness={c.staleness} (valid: staleness=0)",
    )
    _need(
        c.precision != "fp16",
        "async_ps=true has no dynamic loss scaling (one scale for "
        "asynchronous workers): precision=fp16 is refused (valid: fp32, bf16)",
    )
    _need(
        not c.resume,
        "async_ps=true cannot resume: the order in which asynchronous "
        "gradients arrive is not reproducible (valid: resume=false, a new name=)",
    )
    _need(
        c.checkpoint_every == 0,
        f"async_ps=true writes one checkpoint, at the end (resume "
        f"is refused): checkpoint_every={c.checkpoint_every} must be 0",
    )


def _check_shapes(c: Config) -> None:
    """The model, the data and how the batch divides into BN groups and micro-batches."""
    _need(
        not c.pool5_bn or c.model in ("alexnet", "alexnet_bn"),
        f"pool5_bn=true applies to model=alexnet or alexnet_bn, not model={c.model}",
    )
    _need(
        c.batch_size % c.bn_batch == 0,
        f"batch_size={c.batch_size} is not a multiple of bn_batch={c.bn_batch}",
    )
    if c.micro_batch != "auto":
        mb = c.micro_batch if c.micro_batch is not None else c.bn_batch
        _need(mb % c.bn_batch == 0, f"micro_batch={mb} is not a multiple of bn_batch={c.bn_batch}")
        _need(
            c.batch_size % mb == 0,
            f"batch_size={c.batch_size} is not a multiple of micro_batch={mb}",
        )
    if c.dataset in ("cifar10", "imagenet"):
        _need(c.data_dir is not None, f"data_dir is required for dataset={c.dataset}")
        _need(
            Path(c.data_dir).is_dir(),
            f"data_dir={c.data_dir!r} does not exist (dataset={c.dataset} reads from it)",
        )
    _need(
        c.model != "resnet" or (c.depth - 2) % 6 == 0,
        f"depth={c.depth} is not 6n+2 for model=resnet (valid: 8, 14, 20, 32, 44, 56, 110, …)",
    )


def check_folder_path(key: str, value: str | None, error: type[ValueError] = ConfigError) -> None:
    """A place the user chooses (``out_dir``, ``data_dir``), absolute or relative, but a path: no
    NUL, and not empty; else ``error``, one line naming ``key``."""
    problem = key_problem(key, value)
    if problem:
        raise error(problem)


# -- loading ----------------------------------------------------------------------------------


def _allows_none(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple


def parse_value(key: str, text: str) -> Any:
    """Turn the text of a command-line ``key=value`` into what the field expects.

    Scalars stay strings and are coerced by the schema (``"8192"`` → 8192, ``"true"`` → True);
    ``null``/``none`` mean None for keys that allow it; lists are ``30,60,80`` or ``[30, 60, 80]``.
    """
    tp = _hints()[key]
    if _allows_none(tp) and text.strip().lower() in ("null", "none", "~"):
        return None
    if _is_tuple(tp):
        text = text.strip()
        if text.startswith("["):
            try:
                return yaml.safe_load(text)
            except yaml.YAMLError as e:
                first = str(e).splitlines()[0]
                raise ConfigError(f"{key}={text}: not a list like [30, 60, 80] ({first})") from None
        return [t.strip() for t in text.split(",") if t.strip()]
    return text


_HINTS: dict[str, Any] = {}


def _hints() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(Config))
    return _HINTS


def unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; `lbsgd keys` lists the vocabulary"


def from_dict(values: Mapping[str, Any]) -> Config:
    """Validate a flat mapping of keys into a Config; raises ConfigError with one line."""
    for key in values:
        if key not in FIELDS:
            raise ConfigError(unknown_key_message(str(key)))
    try:
        return Config(**values)
    except pydantic.ValidationError as e:
        raise ConfigError(_one_line(e, values)) from None


def _one_line(e: pydantic.ValidationError, values: Mapping[str, Any]) -> str:
    parts = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        loc = [p for p in err["loc"] if isinstance(p, str)]
        if loc and loc[0] in FIELDS:
            key = loc[0]
            parts.append(f"{key}={values.get(key)!r}: {msg}")
        else:
            parts.append(msg)
    return "; ".join(dict.fromkeys(parts))


def run_list(runs: Any) -> list[dict[str, Any]]:
    """A sweep's runs as dicts of keys (not yet validated), or one line saying what a run list is:
    a dict alone would iterate as its key names, a string as its characters."""
    example = "(valid: a list of dicts of keys, e.g. [{'batch_size': 256}, {'batch_size': 512}])"
    if isinstance(runs, Mapping | str | bytes) or not isinstance(runs, Iterable):
        raise ConfigError(f"runs: a {type(runs).__name__}, not a list of runs {example}")
    runs = list(runs)
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping):
            raise ConfigError(f"runs[{i}]: a {type(run).__name__}, not a dict of keys {example}")
    return [dict(run) for run in runs]


def parse_overrides(args: Iterable[str]) -> dict[str, Any]:
    """``["batch_size=8192", "warmup=gradual"]`` → a dict of field values (not yet validated)."""
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, text = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{arg!r} is not key=value")
        if key not in FIELDS:
            raise ConfigError(unknown_key_message(key))
        out[key] = parse_value(key, text)
    return out


def read_yaml(path: str | os.PathLike, derived: bool = False) -> dict[str, Any]:
    """A flat YAML mapping of keys. Derived values and :data:`RECORD_KEYS` in a run's config.yaml
    are accepted and left out, or kept with ``derived=True`` (what the run was: its world_size,
    micro_batch, the run it was copied from, ...)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {e.start}: {e.reason})"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not valid YAML: {str(e).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a flat mapping of key: value")
    drop = (*DERIVED_KEYS, *RECORD_KEYS)
    return data if derived else {k: v for k, v in data.items() if k not in drop}


def read_values(files: Sequence[str | os.PathLike] = (), overrides: Sequence[str] = ()) -> dict:
    """Each YAML file in order, then ``key=value`` overrides: the keys they set, each checked
    alone (:func:`check_values`) before anything is derived from it, imported or pinned by it."""
    values: dict[str, Any] = {}
    for f in files:
        values.update(read_yaml(f))
    values.update(parse_overrides(overrides))
    return check_values(values)


def load(files: Sequence[str | os.PathLike] = (), overrides: Sequence[str] = ()) -> Config:
    """Defaults, then each YAML file in order, then ``key=value`` overrides; each key checked
    alone first, then the plugins imported, then the rules across keys."""
    values = read_values(files, overrides)
    import_plugins(values.get("plugins", ()))
    return from_dict(values)


def import_plugins(plugins: Iterable[str] | str) -> None:
    """Import user modules (``pkg.mod`` or ``path/to/file.py``) so their registrations happen."""
    if isinstance(plugins, str):
        plugins = [p for p in plugins.split(",") if p]
    for spec in plugins:
        if spec not in sys.modules:
            _import_plugin(spec)


def _plugin_module_name(spec: str) -> str:
    return f"lbsgd_plugin_{Path(spec).stem}"


def _import_plugin(spec: str) -> None:
    """Import one plugin; whatever it raises becomes one line naming it (and a file plugin is not
    left half-imported: a retry imports it again and fails the same way)."""
    try:
        if spec.endswith(".py"):
            _import_file(spec)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            importlib.import_module(spec)
    except ConfigError:
        raise
    # SystemExit too: a script's sys.exit("usage: ...") at import time
    except (Exception, SystemExit) as e:  # the plugin's own code failed importing
        if spec.endswith(".py"):
            sys.modules.pop(_plugin_module_name(spec), None)
        if isinstance(e, ImportError):
            raise ConfigError(f"plugins: cannot import {spec!r}: {e}") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(
            f"plugins: importing {spec!r} raised {type(e).__name__}"
            + (f": {first}" if first else "")
        ) from None


def _import_file(spec: str) -> None:
    path = Path(spec)
    if not path.is_file():
        problem = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(f"plugins: file {spec!r} {problem}")
    mod_name = _plugin_module_name(spec)
    if mod_name in sys.modules:
        return
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(mspec)  # type: ignore[arg-type]
    sys.modules[mod_name] = module
    mspec.loader.exec_module(module)  # type: ignore[union-attr]


# -- derived values ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Derived:
    """Everything computed from the keys, the world size and the train-split size. One place."""

    world_size: int
    micro_batch: int  # samples per process per forward/backward
    accum_steps: int  # micro-batches per process per optimizer step
    num_train: int  # N: samples in the train split
    steps_per_epoch: float  # N / kn (fractional: epochs are counted in samples, see data.sampler)
    total_steps: int  # ceil(epochs * N / kn)
    lr: float  # peak learning rate eta-hat = base_lr * f(kn / reference_batch)
    warmup_start_lr: float  # first lr of the warmup
    warmup_steps: int  # round(warmup_epochs * N / kn)
    milestone_steps: tuple[int, ...]  # round(milestone * N / kn), schedule=step
    noise_batch: int | None = None  # B_small of noise_scale=true (lbsgd.noise_scale); None: off

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


DERIVED_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Derived))
# What a run's config.yaml may record beside its keys and derived values: a sweep's copy of a run
# trained by another study names it (``copied_from: <study>/<run>``; lbsgd.experiments.sweep)
RECORD_KEYS: tuple[str, ...] = ("copied_from",)


def _nearest(x: float) -> int:
    return int(math.floor(x + 0.5))  # round half up: no banker's rounding of iteration counts


def world_size_key(c: Config) -> str | None:
    """The experiment key that makes the number of processes K part of the run's mathematics, or
    None. A synchronous run is the same on any layout (k processes x m = 1 process accumulating k
    micro-batches of m); under ``local_sgd`` (and BMUF on its blocks) K models are averaged, and
    under ``async_ps`` the K - 1 workers set the staleness: a run of K processes is another
    experiment than one of K' (:func:`lbsgd.rundir.check_run_dir` and the sweep's identical-run
    search hold it)."""
    if c.async_ps:
        return "async_ps"
    if c.local_sgd:
        return "local_sgd"
    return None


def micro_batch(c: Config, world_size: int = 1) -> int:
    """The micro-batch of a fixed ``micro_batch`` key; for ``auto``, the largest candidate (the
    probe, ``pick_micro_batch``, picks among :func:`micro_batch_candidates` on a device), or one
    line saying why there is none."""
    if c.micro_batch == "auto":
        return _largest_auto(c, world_size) or _no_auto(c, world_size)
    return c.micro_batch if c.micro_batch is not None else c.bn_batch


def _largest_auto(c: Config, world_size: int) -> int:
    """The largest multiple of bn_batch dividing the per-process share (and the noise scale's
    small batch): their gcd when bn_batch divides it; 0 when there is none."""
    if c.async_ps:  # one update = one worker's whole batch (lbsgd.parameter_server)
        world_size = 1
    if c.batch_size % world_size:
        return 0
    share = c.batch_size // world_size
    # noise_scale with a fixed small batch: micro-batches make it up whole
    group = c.noise_scale_batch if c.noise_scale and c.noise_scale_batch else share
    largest = math.gcd(share, group)
    return largest if largest % c.bn_batch == 0 else 0


def _no_auto(c: Config, world_size: int) -> int:
    world_size = 1 if c.async_ps else world_size
    raise ConfigError(
        f"micro_batch=auto: batch_size={c.batch_size} is not a multiple of world_size * "
        f"bn_batch = {world_size} * {c.bn_batch} = {world_size * c.bn_batch}"
    )


def micro_batch_candidates(c: Config, world_size: int) -> list[int]:
    """Multiples of bn_batch that divide the per-process share batch_size / world_size, largest
    first (empty when the share is not a multiple of bn_batch): bn_batch times each divisor of
    the largest over bn_batch."""
    n = _largest_auto(c, world_size) // c.bn_batch
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return [c.bn_batch * d for d in sorted({*small, *(n // d for d in small)}, reverse=True)]


def check_world(
    c: Config, world_size: int, local_world_size: int | None = None, micro: int | None = None
) -> int:
    """Accumulation steps for this world size (and micro-batch ``micro``, the key's by default),
    or one line saying why the mapping is impossible."""
    if c.async_ps:  # one update = one worker's whole batch (lbsgd.parameter_server)
        world_size = 1
    if c.comm_hook == "hierarchical" and local_world_size and world_size % local_world_size:
        raise ConfigError(
            f"comm_hook=hierarchical needs the same number of processes on every node: "
            f"world_size={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}"
        )
    if micro is None and c.micro_batch == "auto":
        micro = micro_batch(c, world_size)
    m = micro if micro is not None else micro_batch(c)
    per_step = world_size * m
    if c.batch_size % per_step:
        raise ConfigError(
            f"batch_size={c.batch_size} is not a multiple of world_size * micro_batch = "
            f"{world_size} * {m} = {per_step}"
        )
    if c.noise_scale:
        noise_batch(c, world_size, m)
    return c.batch_size // per_step


def noise_batch(c: Config, world_size: int, micro: int) -> int | None:
    """B_small of ``noise_scale`` (None when it is off), or one line saying why the layout
    cannot measure it: the small batch is whole micro-batches of one process, and smaller than
    the global batch."""
    if not c.noise_scale:
        return None
    b_small = c.noise_scale_batch or micro
    key = (
        f"noise_scale_batch={c.noise_scale_batch}"
        if c.noise_scale_batch
        else f"noise_scale_batch=null (= micro_batch={micro})"
    )
    share = c.batch_size // world_size
    if b_small % micro or share % b_small:
        raise ConfigError(
            f"{key} must be a multiple of micro_batch={micro} dividing the per-process share "
            f"batch_size / world_size = {c.batch_size} / {world_size} = {share}"
        )
    if b_small >= c.batch_size:
        raise ConfigError(
            f"noise_scale=true compares two batch sizes: {key} must be smaller than "
            f"batch_size={c.batch_size} (valid: a multiple of micro_batch={micro} dividing "
            f"{share}, below {c.batch_size})"
        )
    return b_small


def derive(c: Config, world_size: int, num_train: int, micro: int | None = None) -> Derived:
    """``micro``: the micro-batch chosen for ``micro_batch=auto`` (the largest candidate if None)."""
    if micro is None:
        micro = micro_batch(c, world_size)
    accum = check_world(c, world_size, micro=micro)
    scale = lr_scale(c.lr_scaling, c.batch_size / c.reference_batch)
    spe = num_train / c.batch_size
    return Derived(
        world_size=world_size,
        micro_batch=micro,
        accum_steps=accum,
        num_train=num_train,
        steps_per_epoch=spe,
        total_steps=max(1, math.ceil(c.epochs * spe - 1e-9)),
        lr=c.base_lr * scale,
        warmup_start_lr=c.warmup_lr if c.warmup_lr is not None else c.base_lr,
        warmup_steps=0 if c.warmup == "none" else _nearest(c.warmup_epochs * spe),
        milestone_steps=tuple(_nearest(m * spe) for m in c.milestones),
        noise_batch=noise_batch(c, world_size, micro),
    )


def dump(c: Config, d: Derived | None = None) -> str:
    """YAML of every key, then the derived values (flat: ``key: value``, no nesting, the keys' one
    vocabulary)."""
    text = yaml.safe_dump(c.to_dict(), sort_keys=False)
    if d is not None:
        text += "# derived (lbsgd.config.derive)\n" + yaml.safe_dump(d.to_dict(), sort_keys=False)
    return text


def describe_keys() -> str:
    """The vocabulary as a table: key, kind, type, default, help."""
    rows = []
    for f in dataclasses.fields(Config):
        tp = _hints()[f.name]
        tname = getattr(tp, "__name__", None) if not typing.get_args(tp) else None
        tname = tname or str(tp).replace("typing.", "").replace("NoneType", "None")
        rows.append((f.name, f.metadata["kind"], tname, repr(f.default), f.metadata["help"]))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:<{w[3]}}  {r[4]}" for r in rows
    )


__all__ = [
    "Config",
    "ConfigError",
    "Derived",
    "DERIVED_KEYS",
    "RECORD_KEYS",
    "KEYS",
    "HASHED_ONLY_OFF_DEFAULT",
    "derive",
    "check_world",
    "world_size_key",
    "check_place",
    "check_folder_path",
    "check_values",
    "key_problem",
    "KEY_RULES",
    "lr_scale",
    "run_list",
    "dump",
    "from_dict",
    "load",
    "parse_overrides",
    "read_yaml",
    "read_values",
    "describe_keys",
    "import_plugins",
]
