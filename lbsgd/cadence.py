"""The cadence of a training loop and its clock, shared by the synchronous trainer and the
parameter server.

- :func:`decide`: per optimizer step, whether to flush the metrics, evaluate, checkpoint, stop; a
  pure function of the step, the run's length and the config's cadences.
- :class:`WindowClock`: training time in windows that tile it (one per metric flush), with the
  time spent evaluating and checkpointing set aside.
- :class:`StopSignals`: a scheduler's stop request recorded instead of killing the process.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from lbsgd.config import Config

# Asked to stop (a scheduler's pre-emption or time limit: SLURM sends SIGTERM, or the signal of
# --signal=USR1@90 or USR2@90; torchrun's agent passes its own SIGTERM on to the workers): the
# processes agree on a step at the next metric flush, write a checkpoint there and exit with
# "interrupted". SIGINT (Ctrl-C on `lbsgd train`, at the terminal on torchrun and its workers) stops the same way:
# status "interrupted", exit code 143, whichever signal asked.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)

# -- the per-step decisions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Cadence:
    """When a run flushes, evaluates and checkpoints: the config's keys and the run's length."""

    total_steps: int
    log_every: int  # optimizer steps between metric flushes (at the latest)
    eval_every: int  # epochs between evaluations (0: only at the end)
    checkpoint: bool  # whether checkpoints are written at all
    checkpoint_every: int  # optimizer steps between checkpoints besides epoch ends (0: none)
    epoch_of: Callable[[int], float]  # epochs completed after a number of steps (StepSampler's)
    # steps of the extra evaluations at log-spaced steps (:func:`log_steps`; empty: none)
    probe_steps: frozenset[int] = frozenset()

    @classmethod
    def of(cls, cfg: Config, total_steps: int, epoch_of: Callable[[int], float]) -> Cadence:
        return cls(
            total_steps,
            cfg.log_every,
            cfg.eval_every,
            cfg.checkpoint,
            cfg.checkpoint_every,
            epoch_of,
            frozenset(log_steps(total_steps, cfg.eval_per_octave)),
        )


def log_steps(total_steps: int, per_octave: int) -> list[int]:
    """The steps ⌈2^(j/per_octave)⌉, j = 0, 1, ..., up to ``total_steps``, each once: the
    evaluations of ``eval_per_octave`` (Shallue et al.'s steps to a target error, read on a log
    scale to a ratio of 2^(1/per_octave) at most). Empty when ``per_octave`` is 0."""
    if per_octave <= 0:
        return []
    out: list[int] = []
    j = 0
    while (s := math.ceil(2.0 ** (j / per_octave))) <= total_steps:
        if not out or s != out[-1]:
            out.append(s)
        j += 1
    return out


class Decision(NamedTuple):
    """What the loop does after an optimizer step, in this order."""

    flush: bool  # average and log the pending losses (the collective that agrees on a stop)
    boundary: bool  # an epoch's end or the last step: local SGD's models are averaged here
    evaluate: bool  # evaluate on the test split
    checkpoint: bool  # write a checkpoint
    stop: bool  # leave the loop, asked to stop (status "interrupted")
    # evaluate the held-out split alone (the test split without one): a step of ``probe_steps``
    # that is not a full evaluation's, where the processes' models agree
    probe: bool = False


def decide(
    cadence: Cadence,
    done: int,
    pending: int,
    in_sync: bool = True,
    stop_agreed: bool = False,
) -> Decision:
    """The decisions after step ``done`` (1-based: ``done`` steps are complete), with ``pending``
    steps not flushed yet (this one included).

    At an epoch's end and at the last step: flush, evaluate (at the last step, and every
    ``eval_every`` epochs), checkpoint. Between them, every ``checkpoint_every`` steps, a
    checkpoint where the processes' models agree (``in_sync``: not inside a local SGD block); every
    step before a checkpoint is flushed first, so a resumed run's metrics miss none. A stop agreed
    at a flush (``stop_agreed``) ends the run there, with a checkpoint where the models agree; at
    the last step the run completes instead. At a step of ``probe_steps`` (``eval_per_octave``)
    that evaluates nothing else, a probe: the held-out split alone, where the models agree.
    """
    last, epoch, boundary = _position(cadence, done)
    save_due = not boundary and _checkpoint_due(cadence, done, in_sync)
    stop = stop_agreed and not last
    # at a boundary: the last step's evaluation, and every eval_every epochs
    every = cadence.eval_every
    evaluate = boundary and (last or (bool(every) and epoch % every == 0))
    return Decision(
        flush=boundary or save_due or pending >= cadence.log_every,
        boundary=boundary,
        evaluate=evaluate,
        checkpoint=_checkpoints(cadence, boundary or save_due, stop and in_sync),
        stop=stop,
        probe=done in cadence.probe_steps and in_sync and not evaluate,
    )


def _position(cadence: Cadence, done: int) -> tuple[bool, int, bool]:
    """After step ``done``: whether it is the last, the epochs completed, and whether it ends an
    epoch (or the run)."""
    last = done == cadence.total_steps
    # epochs completed: epoch_of is steps·batch/N, exact at whole epochs (integers far below 2^53)
    epoch = math.floor(cadence.epoch_of(done))
    return last, epoch, last or epoch > math.floor(cadence.epoch_of(done - 1))


def _checkpoint_due(cadence: Cadence, done: int, in_sync: bool) -> bool:
    """A checkpoint of ``checkpoint_every`` after step ``done``, where the models agree."""
    every = cadence.checkpoint_every
    return bool(every) and done % every == 0 and cadence.checkpoint and in_sync


def _checkpoints(cadence: Cadence, due: bool, stopping_in_sync: bool) -> bool:
    """A checkpoint: at a boundary or when due, or at an agreed stop where the models agree."""
    return cadence.checkpoint and (due or stopping_in_sync)


# -- time -----------------------------------------------------------------------------------------


class WindowClock:
    """Training time since the loop started, less the time set aside (evaluation, checkpoints);
    cut into windows, one per metric flush, that tile it (a flush's own host time is counted in
    the next window)."""

    def __init__(self) -> None:
        self.start = self.window = time.perf_counter()
        self.aside = 0.0  # seconds set aside: evaluation and checkpoints, not training
        self.train_s = 0.0  # training seconds up to the last closed window
        self.settle_s = 0.0  # training seconds up to the end of the settling steps

    def elapsed(self) -> float:
        """Training seconds so far."""
        return time.perf_counter() - self.start - self.aside

    def close_window(self, samples: int) -> float:
        """End the current window, which trained ``samples`` samples; returns its samples/s."""
        now = time.perf_counter()
        self.train_s = now - self.start - self.aside
        rate = samples / max(now - self.window, 1e-9)
        self.window = now
        return rate

    def mark_settled(self) -> None:
        """The settling steps (timed apart from the steady state) end here."""
        self.settle_s = self.elapsed()

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Time spent in the block is not training time (nor the current window's)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - t0
            self.aside += spent
            self.window += spent


# -- stop signals ---------------------------------------------------------------------------------


class StopSignals:
    """Within ``with``: STOP_SIGNALS are recorded (``caught``: the signal's name) instead of
    killing the process; the loop acts on them at its next agreement point. The handlers they
    replace are put back on exit."""

    def __init__(self) -> None:
        self.caught: str | None = None
        self._handlers: dict[Any, Any] = {}

    def _record(self, signum: int, frame: Any) -> None:
        self.caught = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        try:
            for sig in STOP_SIGNALS:
                self._handlers[sig] = signal.signal(sig, self._record)
        except ValueError:  # not the main thread: leave signals to whoever owns it
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        self._handlers = {}
