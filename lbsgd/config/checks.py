"""The checks: each key alone, then the rules across keys and the place a run is written. Each
refusal is one line naming the key and what would be valid.

Each key alone first (:func:`key_problem`, :func:`check_values`: before a plugin is imported or
anything derived from it), then the rules across keys when a Config is made (:func:`check_config`)
and the place a run goes (:func:`check_place`). The layout a run goes on is checked beside the
values it derives (:func:`lbsgd.config.derived.check_world`), below this module."""

from __future__ import annotations

import functools
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic

from lbsgd.config import optimizers, step_features
from lbsgd.config.derived import lr_scale
from lbsgd.config.schema import FIELDS, KEYS, Keys, hints, unknown_key_message
from lbsgd.registry import ConfigError

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
    and where folders are still to be made, a folder can be made in the deepest existing one (one
    is made there and removed: :func:`_cannot_make_in`); a run folder that exists is not asked for
    write access (a completed run is read, not written)."""
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
            why = None if made is None else _cannot_make_in(made)
            _need(
                why is None,
                f"out_dir={str(out_dir)!r}: {str(made)!r} cannot be written in ({why}), where "
                f"{str(steps[-1][1])!r} would be made (valid: a folder you can write in)",
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


def _cannot_make_in(folder: Path) -> str | None:
    """Why no folder can be made in ``folder`` (None: one can): asked of the file system itself, a
    folder made and removed at once, since permission bits do not tell (root passes ``os.access``
    everywhere, and /proc, /sys or a read-only mount refuse it anyway)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lbsgd-check-", dir=folder))
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


# -- each key alone: checked before anything is derived from it ----------------------------------

# The largest float32: lrs, decays, loss scales and noise levels become float32 tensor values
FLOAT32_MAX = 3.4028234663852886e38
# float keys whose value enters float32 arithmetic as it is (the peak lr is checked as derived)
FLOAT32_KEYS = (
    "warmup_lr",
    "weight_decay",
    "lars_eta",
    "adam_eps",
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
# The data order's seed of epoch e is seed * SEED_STRIDE + e (lbsgd.seeding.epoch_order)
SEED_STRIDE = 1_000_003
# Epochs stop well before 2^64, the bound of every epoch's data-order seed (with seed 0)
MAX_EPOCHS = 2.0**63
# keys where 0 means "none" or "off" (or is a length, a seed; base_lr 0: a fixed point, the noise
# scale of a model as it is, lbsgd.noise_scale)
NON_NEGATIVE_KEYS = (
    "base_lr",
    "warmup_epochs",
    "weight_decay",
    "workers",
    "threads",
    "eval_every",
    "eval_per_octave",
    "bucket_cap_mb",
    "local_sgd",
    "switch_step",
    "checkpoint_every",
    "seed",
)

# float keys above 0, and decays and momenta in [0, 1)
GREATER_THAN_0_KEYS = ("epochs", "poly_power", "lars_eta", "adam_eps", "loss_scale")
FRACTION_KEYS = ("momentum", "adam_beta1", "adam_beta2", "noise_scale_ema", "block_momentum")


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
    *((k, lambda v: v > 0, "must be > 0") for k in GREATER_THAN_0_KEYS),
    *((k, lambda v: 0 <= v < 1, "must be in [0, 1)") for k in FRACTION_KEYS),
    (
        "epochs",
        lambda v: v <= MAX_EPOCHS,
        f"is too large: epoch e's data order is seeded with seed * {SEED_STRIDE} + e, below 2^64 "
        "(valid: epochs <= 2^63)",
    ),
    (
        "threads",
        lambda v: v <= MAX_THREADS,
        "is too large: more than any CPU node has cores, and the OpenMP runtime fails to start "
        f"that many (valid: 0 = torch's default, or 1 … {MAX_THREADS})",
    ),
    ("warmup_lr", lambda v: v > 0, "must be > 0 (or null)"),
    ("decay_factor", lambda v: 0 < v <= 1, "must be in (0, 1]"),
    ("powersgd_rank", lambda v: v >= 1, "must be a positive integer"),
    ("noise_scale_batch", lambda v: v > 0, "must be a positive integer (or null)"),
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
    ("holdout", lambda v: v >= 0, "must be >= 0 (0 = no held-out validation split)"),
    ("grad_clip", lambda v: v > 0, "must be a global L2 norm > 0 (or null: no clipping)"),
    (
        "stop_at_error",
        lambda v: 0 < v < 100,
        "must be a top-1 error in %, 0 < stop_at_error < 100 (or null: every step)",
    ),
    (
        "milestones",
        lambda v: all(m >= 0 for m in v) and list(v) == sorted(v),
        "must be non-negative epochs in increasing order",
    ),
    ("micro_batch", lambda v: v == "auto" or v > 0, "must be a positive integer, auto or null"),
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
    any value is derived from the keys (:func:`check_config`, :func:`check_values`)."""
    if value is None:
        return None
    problem = _number_problem(key, value)
    if problem:
        return problem
    for ok, why in _RULES_OF.get(key, ()):
        if not ok(value):
            return why(value) if callable(why) else f"{key}={_shown(value)} {why}"
    return None


@functools.cache
def _adapter(key: str) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(hints()[key])


def _typed(key: str, value: Any) -> tuple[Any, str | None]:
    """``value`` as ``key``'s type makes it (the schema's coercion: "8192" -> 8192), or the
    one-line problem with its type."""
    try:
        return _adapter(key).validate_python(value), None
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


def check_config(c: Keys) -> None:
    """Each key alone first (:func:`key_problem`, every bad key named), then the rules across keys
    and on derived values, each failing with one line that names the key and what would be valid."""
    problems = [p for p in (key_problem(k, getattr(c, k)) for k in KEYS) if p]
    _need(not problems, "; ".join(problems))
    _check_derived(c)
    _check_gradient_rules(c)
    if c.async_ps:
        _check_async_ps(c)
    _check_shapes(c)
    _check_holdout(c)
    if c.name is None:  # model and dataset (a plugin's registered names) make the run name
        _need(
            _plain_folder_name(c.run_name()),
            f"run name {c.run_name()!r} (from model and dataset) {FOLDER_NAME_RULE}",
        )


def _check_derived(c: Keys) -> None:
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


def _check_gradient_rules(c: Keys) -> None:
    """Which gradient exchanges combine: the noise scale, local SGD, BMUF and staleness."""
    _need(not c.nesterov or c.momentum > 0, "nesterov=true needs momentum > 0")
    problems = ignored_keys(c, always=True)
    _need(not problems, "; ".join(problems))
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
    _need(
        c.grad_clip is None or c.local_sgd == 0,
        f"grad_clip={c.grad_clip} clips the all-reduced gradient of every step: local_sgd="
        f"{c.local_sgd} reduces none within a block (valid: local_sgd=0, or grad_clip=null)",
    )
    # -- simulated asynchronous SGD (lbsgd.staleness) --
    _need(
        c.staleness == 0 or c.local_sgd == 0,
        f"staleness={c.staleness} delays the gradients of synchronous steps: not with "
        f"local_sgd={c.local_sgd} (valid: local_sgd=0)",
    )


def _check_async_ps(c: Keys) -> None:
    """What an asynchronous parameter server (lbsgd.parameter_server) cannot combine with: every
    step feature (its refusal from lbsgd.config.step_features's table), then the rest."""
    for row in step_features.TABLE:
        _need(not row.asked(c), row.async_ps_refusal(c))
    _need(
        c.comm_hook == "none",
        f"async_ps=true sends each gradient to the server point to "
        f"point: not with comm_hook={c.comm_hook} (valid: comm_hook=none)",
    )
    _need(
        c.stop_at_error is None,
        f"async_ps=true keeps updating while gradients are in flight, so a run cannot end at "
        f"its target's step: not with stop_at_error={c.stop_at_error} (valid: stop_at_error=null)",
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


def _check_shapes(c: Keys) -> None:
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


# The keys that only one built-in dataset reads; its ``*_train`` key sets the size of its train
# split, known before any data is read (cifar10's is its 50,000 training images; a file dataset's
# and a plugin's are checked when the dataset is built, still before training: lbsgd.data.hold_out)
DATASET_KEYS = {
    "synthetic": ("synthetic_train", "synthetic_test", "synthetic_difficulty", "synthetic_noise"),
    "fake": ("fake_train", "fake_test", "fake_image_size", "fake_classes"),
    "fashion_mnist": ("fashion_size", "fashion_train"),
}
CIFAR10_TRAIN = 50_000


def _check_holdout(c: Keys) -> None:
    """The held-out validation split leaves at least one image to train on."""
    key = next((k for k in DATASET_KEYS.get(c.dataset, ()) if k.endswith("_train")), None)
    if key:
        size, where = getattr(c, key), f"{key}={getattr(c, key)}"
    elif c.dataset == "cifar10":
        size, where = CIFAR10_TRAIN, f"dataset=cifar10's {CIFAR10_TRAIN:,} training images"
    else:
        return
    _need(
        c.holdout < size,
        f"holdout={c.holdout} must be less than the train split's size, {where} (valid: 0 to "
        f"{size - 1}; 0 = no held-out split)",
    )


def check_folder_path(key: str, value: str | None) -> None:
    """A place the user chooses (``out_dir``, ``data_dir``), absolute or relative, but a path: no
    NUL, and not empty; else a ConfigError, one line naming ``key``."""
    problem = key_problem(key, value)
    if problem:
        raise ConfigError(problem)


# -- keys that a setting ignores -----------------------------------------------------------------


# Keys that only one setting reads, each with that setting: the one place the rule lives. Set to
# other than its default where its setting is off, such a key trains as if it were absent and
# still changes the run's id, so it is refused in one line. The rules marked "always" hold for
# every Config (check_config); the others for the keys a user gives explicitly, in a YAML file or
# a key=value (:func:`check_ignored`, from :func:`lbsgd.config.load`): the studies build their
# runs from whole profiles (the none arm of a warmup study keeps the profile's warmup_epochs).
USED_ONLY_WHEN: tuple[tuple[tuple[str, ...], str, Callable[[Any], bool], bool], ...] = (
    *(  # the optimizer-specific keys, from the optimizers' table
        (
            keys,
            "optimizer=" + " or ".join(names),
            lambda c, names=names: c.optimizer in names,
            any(k in optimizers.ALWAYS_REFUSED for k in keys),
        )
        for keys, names in optimizers.key_groups()
    ),
    (("milestones", "decay_factor"), "schedule=step", lambda c: c.schedule == "step", False),
    (("poly_power",), "schedule=poly", lambda c: c.schedule == "poly", False),
    (
        ("warmup_epochs", "warmup_lr"),
        "warmup=gradual or constant",
        lambda c: c.warmup != "none",
        False,
    ),
    (("loss_scale",), "precision=fp16", lambda c: c.precision == "fp16", False),
    (("staleness_dist",), "staleness > 0", lambda c: c.staleness > 0, False),
    (("powersgd_rank",), "comm_hook=powersgd", lambda c: c.comm_hook == "powersgd", False),
    (
        ("block_momentum", "block_lr", "block_nesterov"),
        "local_sgd > 0 (BMUF filters local SGD's blocks)",
        lambda c: c.local_sgd > 0,
        True,
    ),
    (
        ("switch_step",),
        "local_sgd > 0 or comm_hook=powersgd",
        lambda c: c.local_sgd > 0 or c.comm_hook == "powersgd",
        True,
    ),
    (("noise_scale_batch", "noise_scale_ema"), "noise_scale=true", lambda c: c.noise_scale, False),
    (
        ("stop_at_error",),
        "eval_every > 0 or eval_per_octave > 0 (an evaluation before the end)",
        lambda c: c.eval_every > 0 or c.eval_per_octave > 0,
        True,
    ),
    *(
        (keys, f"dataset={name}", lambda c, name=name: c.dataset == name, False)
        for name, keys in DATASET_KEYS.items()
    ),
)


def ignored_keys(c: Any, given: Iterable[str] = (), always: bool = False) -> list[str]:
    """One line per key that ``c``'s setting ignores (:data:`USED_ONLY_WHEN`) while set to other
    than its default: of the "always" rules (``always``), else of every rule for the keys of
    ``given``."""
    problems, given = [], set(given)
    for keys, setting, used, rule_always in USED_ONLY_WHEN:
        if (always and not rule_always) or used(c):
            continue
        for key in keys:
            if (always or key in given) and getattr(c, key) != FIELDS[key].default:
                problems.append(
                    f"{key}={_shown(getattr(c, key))} has no effect unless {setting}: drop it"
                )
    return problems


def without_ignored(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` less the keys that their own setting (with the defaults) ignores: the keys to
    give a run made from another's."""
    typed = {k: _typed(k, v)[0] for k, v in values.items() if k in FIELDS}  # bad ones: as given
    c = SimpleNamespace(**{**{k: f.default for k, f in FIELDS.items()}, **typed})
    ignored = {k for names, _, used, _ in USED_ONLY_WHEN if not used(c) for k in names}
    return {k: v for k, v in values.items() if k not in ignored}


def check_ignored(c: Any, given: Iterable[str]) -> None:
    """One ConfigError line naming every key in ``given`` (the keys set explicitly) that ``c``'s
    setting ignores (:data:`USED_ONLY_WHEN`) while set to other than its default."""
    problems = ignored_keys(c, given)
    if problems:
        raise ConfigError("; ".join(problems))
