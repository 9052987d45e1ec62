"""How a sweep starts a run: its launch parameters checked, its command line (``python -m lbsgd
train`` or torchrun), its process behind the orphan guard, its log's attempt lines, and the line
of a failed run's log that tells why."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbsgd import config, jobs, launch, rundir
from lbsgd.config import Config

# Each run's process starts through this guard (Linux): it asks the system for SIGTERM when the
# sweep's process dies (PR_SET_PDEATHSIG, kept across exec), so that a run whose kernel is killed
# stops with a checkpoint instead of training on, orphaned, beside its own resumption.
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"  # 1: PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]):\n"  # the sweep died before the guard was in place
    "    sys.exit(143)\n"
    "os.execv(sys.argv[2], sys.argv[2:])"
)


# The first line of each attempt in a run's log (the sweep appends: earlier attempts stay)
ATTEMPT_MARK = "==== attempt "


@dataclass(eq=False)
class SweepRun:
    """A run of the sweep, as the runner's job item (:class:`lbsgd.jobs.Job`; its ``number`` is
    the run's place in the sweep's runs: the [number/total] of each of its lines): its config,
    its log, the log's handle while it runs, and how its attempt starts."""

    cfg: Config
    log: Path
    handle: Any = field(default=None, repr=False)
    how: str = ""


SweepJob = jobs.Job[SweepRun]


def _positive_int(key: str, value: Any, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise config.ConfigError(f"{key}={value!r} must be an integer >= {least}")


def check_launch(
    *,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    parallel: int = 1,
    max_restarts: int = 0,
) -> None:
    """The launch parameters of a sweep (a notebook's), one line naming the bad one."""
    _positive_int("nproc_per_node", nproc_per_node)
    _positive_int("nnodes", nnodes)
    _positive_int("parallel", parallel)
    _positive_int("max_restarts", max_restarts, least=0)
    if nnodes > 1:
        host, sep, port = str(rdzv_endpoint or "").rpartition(":")
        if not sep or not host or not port.isdigit():
            raise config.ConfigError(
                f"rdzv_endpoint={rdzv_endpoint!r}: nnodes={nnodes} needs the host:port of the "
                "rendezvous (the same on every node)"
            )


def train_args(cfg: Config) -> list[str]:
    """The run's ``key=value`` arguments of ``lbsgd train``: every key that is set."""
    return [f"{k}={value_text(v)}" for k, v in cfg.to_dict().items() if v is not None]


def command_line(
    cfg: Config, nproc_per_node: int, nnodes: int, rdzv_endpoint: str | None, max_restarts: int = 0
) -> list[str]:
    overrides = train_args(cfg)
    if nproc_per_node == 1 and nnodes == 1:  # one process: the same trainer, no agent to start
        return [sys.executable, "-m", "lbsgd", "train", *overrides]
    launcher = launch.torchrun(
        nproc_per_node, nnodes=nnodes, endpoint=rdzv_endpoint, max_restarts=max_restarts
    )
    return [*launcher, "-m", "lbsgd", "train", *overrides]


def value_text(v: Any) -> str:
    """A value as a command line's ``key=value`` gives it: a list as ``[a,b]``."""
    if isinstance(v, list | tuple):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def start(run: SweepRun, command) -> subprocess.Popen:
    """Start one run, its output appended to its log after a line that begins the attempt."""
    run.how = how_it_starts(run.cfg.run_dir())
    run.handle = run.log.open("a")
    run.handle.write(f"{attempt_line(run.log, run.how)}\n")
    run.handle.flush()
    guard = [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid())]
    # a session of its own: an interrupt meant for the sweep (a terminal's or Jupyter's, sent to
    # the whole process group) does not kill the run; the sweep stops it
    return subprocess.Popen(
        [*(guard if sys.platform == "linux" else []), *command(run.cfg)],
        stdin=subprocess.DEVNULL,
        stdout=run.handle,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )


def how_it_starts(run_dir: Path) -> str:
    """``resumed …`` when the run has a checkpoint (``resume=true`` continues from it), else
    ``started`` (saying so when an earlier attempt left no checkpoint)."""
    from lbsgd import checkpoint  # torch: already imported by the sweep's checks

    try:
        s = rundir.read_summary(run_dir)
        before = f"the last attempt reached step {s.get('steps')}, status {s.get('status')}"
    except (OSError, ValueError):
        before = ""
    if checkpoint.candidates(run_dir):
        return "resumed from its checkpoint" + (f" ({before})" if before else "")
    return f"started (no checkpoint: {before}; from step 0)" if before else "started"


def attempt_line(log: Path, how: str) -> str:
    """The line that begins an attempt in a run's log: which attempt, when, from where."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    earlier = sum(ln.startswith(ATTEMPT_MARK) for ln in lines)
    if lines and not earlier:  # a log written before attempts were marked
        earlier = 1
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return f"{ATTEMPT_MARK}{earlier + 1}, {when}: {how} ===="


def _last_attempt(log: Path) -> list[str]:
    """The non-blank lines of a run's log after its last attempt line, stripped."""
    lines = log.read_text(errors="replace").splitlines()
    marks = [i for i, ln in enumerate(lines) if ln.startswith(ATTEMPT_MARK)]
    return [ln.strip() for ln in lines[marks[-1] + 1 if marks else 0 :] if ln.strip()]


def error_line(log: Path) -> str:
    """The most telling line of a failed run's log (its last attempt): the last one naming an
    error, not a launcher's line about its process's exit (torchrun's, srun's)."""
    if not log.exists():  # a Slurm job that never started
        return f"no log ({log} was never written)"
    lines = _last_attempt(log)
    for ln in reversed(lines):
        if ("Error" in ln or "error:" in ln) and not ln.startswith(("torch.distributed", "srun:")):
            return ln
    useful = [ln for ln in lines if not set(ln) <= set("=-")]
    return useful[-1] if useful else "(empty log)"
