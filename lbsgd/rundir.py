"""The run directory's policy: whether a run may start there, its status, its summary.json; the
directory opened for a run (:func:`open_run_dir`) and the summary it starts with (:func:`new_summary`).

A directory holding a run is never overwritten: with ``resume=true`` the run continues when its
experiment keys are the same, otherwise a one-line ConfigError names the difference. summary.json
is strict JSON (a diverged loss is written as the string "nan"), replaced atomically.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic
from typing_extensions import Required, TypedDict

from lbsgd.config import Config, ConfigError, Derived, check_place, dump, read_yaml, world_size_key
from lbsgd.tracking import Tracker, finite

if TYPE_CHECKING:
    from lbsgd import data, distributed


class Status(str, enum.Enum):
    """A run's status in summary.json, written as its value (a ``str``: ``"completed"``, …)."""

    RUNNING = "running"  # started, not ended (or killed without a word)
    COMPLETED = "completed"  # every step trained
    DIVERGED = "diverged"  # a non-finite loss
    INTERRUPTED = "interrupted"  # asked to stop (a signal): a checkpoint where the models agree
    FAILED = "failed"  # an error ended it

    def __str__(self) -> str:
        return self.value


# A run's status and the exit code of ``lbsgd train`` (and of W&B's run) that reports it
STATUS_EXIT_CODE = {Status.COMPLETED: 0, Status.DIVERGED: 3, Status.INTERRUPTED: 143}


def check_run_dir(cfg: Config, world_size: int = 1) -> str:
    """'new', 'resume' or 'completed' for a launch of ``world_size`` processes; a directory
    holding another run is never overwritten.

    Reads only: a refusal is a one-line ConfigError and leaves every file as it was."""
    check_place(cfg.out_dir, cfg.study, cfg.run_name())  # a file on the way: no traceback
    run_dir = cfg.run_dir()
    if (run_dir / "config.yaml").exists():
        status = read_status(run_dir)
        if not cfg.resume:
            raise ConfigError(
                f"run directory {str(run_dir)!r} already holds a run (status={status}); pass "
                "resume=true to continue it, or choose another name= or out_dir="
            )
        old = read_yaml(run_dir / "config.yaml", derived=True)
        same_experiment(cfg, old, str(run_dir))
        same_world_size(cfg, old, world_size, str(run_dir))
        return "completed" if status == Status.COMPLETED else "resume"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"run directory {str(run_dir)!r} exists and is not empty; choose another name="
        )
    return "new"


def same_experiment(cfg: Config, old: dict[str, Any], where: str) -> None:
    """Refuse to continue ``old`` (a saved config) with other experiment keys, naming each."""
    new = cfg.keys_of("experiment")
    differ = [k for k in new if k in old and plain(old[k]) != plain(new[k])]
    if differ:
        shown = ", ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in differ)
        raise ConfigError(f"resume=true but experiment keys differ from {where}: {shown}")


def same_world_size(cfg: Config, old: dict[str, Any], world_size: int, where: str) -> None:
    """Refuse to continue (or to count as done) a run whose mathematics depends on the number of
    processes (:func:`lbsgd.config.world_size_key`) on another number than it was trained on."""
    key = world_size_key(cfg)
    trained_on = old.get("world_size")  # the derived value config.yaml records
    if key is None or trained_on is None or trained_on == world_size:
        return
    raise ConfigError(
        f"{key}={getattr(cfg, key)}: {where} was trained by {trained_on} processes and this "
        f"launch has {world_size}; the number of processes is part of {key}'s mathematics: "
        f"launch {trained_on}, or choose another name= or out_dir="
    )


def read_status(run_dir: Path) -> str:
    """The status in ``run_dir/summary.json``; "unknown" when it is missing or unreadable."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status", "unknown")
    except (OSError, ValueError, AttributeError):
        return "unknown"


# -- summary.json's declared shape --------------------------------------------------------------
#
# Both loops (lbsgd.trainer, lbsgd.parameter_server), the step features' after_flush and the sweep's
# copies fill it; write_summary refuses a summary of another shape (a key not declared here, a
# value of another type), so a new field is declared here before any run writes it.

# a loss: a float, or the string summary.json holds for a non-finite one (a diverged run)
Loss = float | Literal["nan", "inf", "-inf"]
_FORBID = pydantic.ConfigDict(extra="forbid", strict=True)


class Evaluated(TypedDict, total=False):
    """``final``: the last flushed train loss and the last evaluation of each split."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]
    train_loss: Loss
    top1_error_pct: float
    top5_error_pct: float
    test_loss: Loss
    val_top1_error_pct: float
    val_top5_error_pct: float
    val_loss: Loss


class Best(TypedDict, total=False):
    """``best``: the lowest top-1 error of the test split and, apart, of the held-out split."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]
    top1_error_pct: float
    step: int
    val_top1_error_pct: float
    val_step: int


class NoiseScaleSummary(TypedDict):
    """``noise_scale`` (noise_scale=true): the smoothed |G|², tr(Σ) and B_simple (None before the
    first step) and the two batch sizes of the probe."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]
    b_simple: float | None
    g_sq: float | None
    trace: float | None
    b_small: int
    b_big: int


class AsyncPSSummary(TypedDict):
    """``async_ps`` (async_ps=true): the workers, the staleness measured (histogram τ → count,
    mean, max), the updates each worker sent and the gradients discarded."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]
    workers: int
    staleness: dict[str, Any]
    updates_per_worker: dict[str, int]
    discarded_gradients: int


class Summary(TypedDict, total=False):
    """summary.json: a run's identity, status and result, written at its start and its end."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]
    # from the start (new_summary)
    status: Required[str]  # a Status's value
    run: Required[str]
    study: Required[str | None]
    experiment_id: Required[str]
    steps: Required[int]  # steps done
    total_steps: Required[int]
    environment: Required[dict[str, Any]]  # lbsgd.environment.environment, backend, determinism
    attempts: int  # a resumed run's attempts, this one included
    total_wall_time_s: float  # over every attempt
    # from the loop
    final: Evaluated
    best: Best
    skipped_steps: int  # fp16 steps skipped for a non-finite gradient
    epochs: float
    wall_time_s: float  # this attempt's
    train_time_s: float
    img_per_s: float | None  # steady training throughput
    warmup_steps_timed: int  # the settling steps timed apart
    warmup_s: float | None
    stopped_at_target: int  # the step where stop_at_error was reached
    noise_scale: NoiseScaleSummary
    async_ps: AsyncPSSummary
    # from the sweep: a run copied from the study that trained it (<study>/<run>)
    copied_from: str


_SUMMARY = pydantic.TypeAdapter(Summary)


def check_summary(summary: Mapping[str, Any]) -> None:
    """A ValueError naming each field of ``summary`` that is not of :class:`Summary`'s shape."""
    status = summary.get("status")
    plain = {**summary, "status": status.value} if isinstance(status, Status) else dict(summary)
    try:
        _SUMMARY.validate_python(plain)
    except pydantic.ValidationError as e:
        problems = [f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()]
        raise ValueError("summary.json of another shape: " + "; ".join(problems)) from None


def read_summary(run_dir: Path) -> dict[str, Any]:
    """``run_dir/summary.json`` as written (a completed run's result)."""
    return json.loads((run_dir / "summary.json").read_text())


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A path beside ``path`` (same folder and suffix, ``.<stem>.partial<suffix>``) to write it
    to, moved over ``path`` only when the block ends without an error: an error or a crash while
    writing leaves the file there before whole, and no partial file behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """``run_dir/summary.json``, replaced atomically (strict JSON: non-finite floats as strings),
    after :func:`check_summary`."""
    check_summary(summary)
    with replacing(run_dir / "summary.json") as tmp:
        tmp.write_text(json.dumps(finite(summary), indent=2, default=str) + "\n")
    # git shows a run folder once the run has a result: an unfinished one ignores itself
    unfinished = str(summary["status"]) not in (Status.COMPLETED, Status.DIVERGED)
    if unfinished:
        (run_dir / ".gitignore").write_text(UNFINISHED)
    else:
        (run_dir / ".gitignore").unlink(missing_ok=True)


UNFINISHED = (
    "# a run not ended (running, interrupted or failed: lbsgd.rundir); resumed where it is\n*\n"
)


def plain(v: Any) -> Any:
    """A value as YAML and JSON read it back: a tuple is a list."""
    return list(v) if isinstance(v, tuple) else v


def open_run_dir(cfg: Config, d: Derived, truncate_after_step: int | None = None) -> Tracker:
    """Rank 0's: the run directory, its config.yaml (keys and derived values), and the tracker
    (metrics.jsonl, W&B); on resume (``truncate_after_step``: the checkpoint's step) the records
    after that step are dropped."""
    run_dir = cfg.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump(cfg, d))
    return Tracker(
        run_dir,
        {**cfg.to_dict(), **d.to_dict()},
        mode=cfg.wandb,
        project=cfg.wandb_project,
        group=cfg.study,
        name=cfg.run_name(),
        truncate_after_step=truncate_after_step,
    )


def new_summary(
    cfg: Config, ctx: distributed.Context, d: Derived, splits: data.Splits, steps: int
) -> Summary:
    """summary.json's content as a run starts (``steps`` done already): status "running", the
    run's identity and its environment (the training split's digest: rank 0's)."""
    # torch with them: imported here, so that reading a run directory (a sweep) does not
    import torch

    from lbsgd import distributed
    from lbsgd.environment import environment

    return {
        "status": Status.RUNNING,
        "run": cfg.run_name(),
        "study": cfg.study,
        "experiment_id": cfg.experiment_id(),
        "steps": steps,
        "total_steps": d.total_steps,
        "environment": {
            **environment(
                ctx.device,
                ctx.world_size,
                cpu_isa=cfg.cpu_isa,
                train_split=splits.train if ctx.is_main else None,
            ),
            "backend": distributed.backend_name(ctx.device, cfg.backend),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
        },
    }
