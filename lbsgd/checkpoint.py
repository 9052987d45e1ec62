"""Training state to disk and back: atomic, verified, with the previous good checkpoint kept.

A checkpoint is one ``torch.save`` dict holding everything the next optimizer step depends on, plus
``digest``, a BLAKE2b hash of all of it checked on load. :func:`save` writes a temporary file and
renames it into place, keeping the previous one as ``checkpoint.prev.pt``, so a crash at any point
leaves a complete checkpoint; :func:`load` reads with ``weights_only=True`` and falls back to the
previous one with one warning. Resuming: :func:`load_agreed`, :func:`check_compatible` and each
rank's own part (:func:`rank_state`). docs/distributed.md has the user's view."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lbsgd import distributed, rundir
from lbsgd.config import Config, ConfigError

if TYPE_CHECKING:
    from lbsgd.data import StepSampler

NAME = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
TMP = f".{NAME}.tmp"
FORMAT = 2  # 1: the single-file checkpoint without digest, sampler or per-rank states


class CheckpointError(ConfigError):
    """No usable checkpoint: one line naming the file(s) and what is wrong with them (like a bad
    key, a refusal before any work: ``lbsgd train`` prints it and exits with 2)."""


def digest(state: Any) -> str:
    """BLAKE2b of a nested state (tensors by dtype, shape and bytes; other values by repr)."""
    h = hashlib.blake2b(digest_size=16)

    def feed(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            h.update(b"{")
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                feed(x[k])
            h.update(b"}")
        elif isinstance(x, list | tuple):
            h.update(b"[")
            for v in x:
                feed(v)
            h.update(b"]")
        else:
            h.update(repr(x).encode())

    feed(state)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not every platform can open a directory
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` as the newest checkpoint of ``run_dir``; the one it replaces becomes PREVIOUS."""
    run_dir = Path(run_dir)
    path, prev, tmp = run_dir / NAME, run_dir / PREVIOUS, run_dir / TMP
    state = {**state, "format": FORMAT}
    state["digest"] = digest(state)
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, prev)
    os.replace(tmp, path)
    _fsync_dir(run_dir)
    return path


def read(path: Path) -> dict[str, Any]:
    """One checkpoint file, verified; CheckpointError naming the file if it cannot be used."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # every unreadable file gets the same clear message
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""  # its first line, whole
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be loaded: {type(e).__name__}: {first}"
        ) from e
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {str(path)!r} is not an lbsgd checkpoint (no 'model')")
    if "digest" in state:
        stored = state.pop("digest")
        if digest(state) != stored:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is corrupted: its contents do not match its digest"
            )
    return state


def candidates(run_dir: Path) -> list[Path]:
    """The checkpoint files of ``run_dir`` that exist, newest first."""
    return [p for p in (Path(run_dir) / NAME, Path(run_dir) / PREVIOUS) if p.exists()]


def load(run_dir: Path) -> dict[str, Any] | None:
    """The newest usable checkpoint of ``run_dir``; None if it has none.

    A checkpoint that cannot be used (truncated, corrupted, not a checkpoint) gives one warning
    line naming it (stderr), and the previous one is tried; CheckpointError if none is usable.
    """
    errors: list[str] = []
    for path in candidates(run_dir):
        try:
            state = read(path)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        if errors:  # one line, as every other lbsgd message
            print(
                f"lbsgd: warning: {errors[-1]}; falling back to {str(path)!r} (step "
                f"{state.get('step')})",
                file=sys.stderr,
                flush=True,
            )
        state["file"] = str(path)
        return state
    if errors:
        raise CheckpointError(" and ".join(errors) + "; no usable checkpoint is left")
    return None


# -- a run's checkpoint: which one, whether it fits the run, each rank's part -------------------


def check_compatible(cfg: Config, state: dict[str, Any], sampler: StepSampler) -> None:
    """Refuse a checkpoint made for other mathematics (other experiment keys), or for another
    train split (a file dataset whose folder gained or lost images: another stream of samples),
    with one line naming the file."""
    rundir.same_experiment(cfg, state.get("config", {}), state["file"])
    saved = state.get("sampler")
    if saved is not None and (
        state.get("num_train") != sampler.num_samples
        or saved != sampler.position(int(state["step"]))
    ):
        raise ConfigError(
            f"checkpoint {state['file']!r} was made on a train split of {state.get('num_train')} "
            f"samples, this run's has {sampler.num_samples}: the data changed, resume is refused"
        )


def load_agreed(
    ctx: distributed.Context, cfg: Config, sampler: StepSampler
) -> dict[str, Any] | None:
    """The checkpoint every rank resumes from: rank 0 picks the newest usable one of the run
    directory (falling back to the previous one with a warning) and checks it fits the run; every
    rank reads that same file. None when the run has none."""
    picked: dict[str, Any] = {}

    def pick() -> str | None:
        state = load(cfg.run_dir())
        if state is not None:
            check_compatible(cfg, state, sampler)
            picked["state"] = state
        return None if state is None else state["file"]

    path = distributed.on_main(ctx, pick)
    if path is None:
        return None
    return picked["state"] if ctx.is_main else read(Path(path))


def rank_state(state: dict[str, Any], ctx: distributed.Context) -> dict[str, Any] | None:
    """This process's part of the checkpoint (RNG states, local momentum, PowerSGD memories), if
    it was saved by as many processes; None otherwise (another layout: those start afresh)."""
    ranks = state.get("ranks")
    if ranks and len(ranks) == ctx.world_size:
        return ranks[ctx.rank]
    return None


# -- random number generators: what a step draws from, saved per rank ---------------------------


def rng_state(device: torch.device) -> dict[str, torch.Tensor | None]:
    """The CPU's generator state, and the training GPU's."""
    return {
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what :func:`rng_state` saved (the GPU's only on a GPU)."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
