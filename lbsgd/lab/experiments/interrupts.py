"""A sweep interrupted (Ctrl-C, Jupyter's interrupt, SIGTERM): its runs asked to stop with a
checkpoint (killed on a second interrupt), each one's place said, and one exception whose line
sums up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lbsgd.lab.experiments.commands import SweepJob
from lbsgd.lab.experiments.lines import Progress, shown
from lbsgd.lab.experiments.results import DONE

if TYPE_CHECKING:
    from lbsgd.jobs import Runner
    from lbsgd.lab.experiments.sweeps import Launcher


class RunInterrupted(KeyboardInterrupt):
    """A sweep was interrupted; its runs were stopped (checkpoint, status ``interrupted``).
    ``runs``: the names of the runs it stopped or did not start."""

    def __init__(self, message: str, runs: Sequence[str] = ()):
        super().__init__(message)
        self.runs = tuple(runs)

    def _render_traceback_(self) -> list[str]:
        # IPython's hook (JupyterLab, papermill): the error's one line instead of a traceback
        # through the sweep's loop; the sweep printed where each run stands
        return [f"{type(self).__name__}: {self}"]


class Terminated(KeyboardInterrupt):
    """SIGTERM to the sweep: an interrupt that asks the runs to stop, never to hurry."""


class HungUp(Terminated):
    """SIGHUP to the sweep: its client went away (a closed terminal or SSH session, the parent of
    ``lbsgd execute``). Slurm's jobs run on, unwatched; local runs stop as on SIGTERM."""


@contextlib.contextmanager
def sigterm_as_interrupt(pass_on: bool = True):
    """SIGTERM to the sweep's process (a scheduler, a kernel shut down by papermill or Jupyter) as
    an interrupt while the sweep runs: the runs stop with a checkpoint and each is named; then the
    signal goes on to the handler it had before (by default the process ends, exit status 143, as
    it would have: a kernel being shut down sends no reply on its closed sockets), unless
    ``pass_on`` is False (a command that ends on an interrupt with its own line and exit status).
    SIGHUP is :class:`HungUp`, not passed on. Yields the signals caught (empty: none). Python
    lets only the main thread set a handler; elsewhere, or where a signal is ignored (nohup), it
    is left as it is. An interrupt Python loses in a callback is sent again (:func:`_sent_again`)."""
    caught: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    if threading.current_thread() is not threading.main_thread():
        before = {}

    def interrupt(signum, frame):
        caught.append(signum)
        raise (HungUp if signum == signal.SIGHUP else Terminated)(
            f"signal {signal.Signals(signum).name}"
        )

    for s, handler in before.items():
        if handler != signal.SIG_IGN:
            signal.signal(s, interrupt)
    unraisable = sys.unraisablehook
    sys.unraisablehook = _sent_again(unraisable)
    try:
        yield caught
    finally:
        sys.unraisablehook = unraisable
        for s, handler in before.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if signal.SIGTERM in caught and pass_on:
            # a kernel's output leaves through a socket thread: time for the last lines to go
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)


def _sent_again(before):
    """An ``sys.unraisablehook`` that keeps an interrupt: Python runs a signal's handler between
    any two bytecodes, and where that is a finalizer or a weakref callback (an import lock's, a
    logging lock's) the exception it raises is printed as "Exception ignored" and lost, and the
    command would go on. The same signal is sent again instead, from a thread, once the callback
    is over; other exceptions go to ``before``."""

    def hook(u) -> None:
        if not isinstance(u.exc_value, KeyboardInterrupt):
            return before(u)
        signum = signal.SIGINT
        if isinstance(u.exc_value, Terminated):
            signum = signal.SIGHUP if isinstance(u.exc_value, HungUp) else signal.SIGTERM
        again = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return None

    return hook


def interrupted(
    study: str, launcher: Launcher, runner: Runner, failed: list[str], progress: Progress
) -> RunInterrupted:
    """Stop the runs in flight (``runner.running``; the last perhaps started as the interrupt
    came) as a scheduler would (``launcher.stop``: checkpoint at an agreed step, status
    interrupted), wait for them, say where each stands and which of ``runner.pending`` were not
    started, one line each; the exception to raise, whose one line sums up."""
    running, todo = runner.running, runner.pending
    killed = _stop(launcher, running, progress.say)
    ended: dict[str, int] = {}  # runs that reached their end as they were asked to stop
    for job in running:
        launcher.close(job)
        text, status = stop_text(job.item.cfg.run_dir())
        if status in DONE:
            ended[status] = ended.get(status, 0) + 1
        progress.line(job, f"{text} (log: {shown(job.item.log)})")
    for job in todo:
        progress.line(job, "not started")
    stopped = len(running) - sum(ended.values())
    how = {"killed" if killed else "stopped": stopped, **ended, "not started": len(todo)}
    how["failed before the interrupt"] = len(failed)
    parts = [f"{_runs(n)} {what}" for what, n in how.items() if n]  # "2 runs stopped", …
    return RunInterrupted(
        f"sweep of study {study!r} interrupted: {', '.join(parts) or 'no run in flight'}; "
        "run the same sweep again to resume",
        [j.item.cfg.run_name() for j in (*running, *todo)],
    )


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _stop(launcher: Launcher, running: list[SweepJob], say) -> bool:
    """Ask every run in flight to stop (SIGTERM: torchrun's agent passes it on to its workers),
    then wait for them; a second interrupt (not a SIGTERM: a kernel manager sends one a few
    seconds after its interrupt) kills them instead. Whether they were killed."""
    for job in running:
        if job.proc.poll() is None:
            launcher.stop(job.proc)
    if running:
        say(
            f"[interrupt] asked {_runs(len(running))} to stop (SIGTERM): each stops at its next "
            "metric flush with a checkpoint; interrupt again to kill them now"
        )
    while True:
        try:
            for job in running:
                job.proc.wait()
            return False
        except Terminated:  # asked to end, not to hurry: the runs go on to their checkpoint
            continue
        except KeyboardInterrupt:  # asked twice: no waiting for the next flush
            for job in running:
                if job.proc.poll() is None:
                    launcher.kill(job.proc)
            for job in running:
                job.proc.wait()
            return True


def stop_text(run_dir: Path) -> tuple[str, str | None]:
    """Where a stopped run stands, from its summary.json (status, step, checkpoint), and its
    status (None: no summary)."""
    from lbsgd import checkpoint  # torch: already imported by the sweep's checks

    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return "stopped before training began", None
    status, steps = s.get("status"), s.get("steps")
    kept = (run_dir / checkpoint.NAME).exists()
    if status in DONE:
        return f"{status} at step {steps}", status
    if status == "interrupted":
        kept_text = "checkpoint kept" if kept else "no checkpoint"
        return f"interrupted at step {steps}, {kept_text}", status
    return f"status {status} at step {steps}, " + (
        "resumes from its last checkpoint" if kept else "no checkpoint: restarts"
    ), status
