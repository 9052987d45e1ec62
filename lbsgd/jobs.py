"""The one runner of subprocesses: start jobs so many at a time, poll them, hand each one back to
its caller as it ends, and leave to the caller what an interrupt does.

The runner decides nothing itself: each caller (a study's sweep, ``lbsgd verify``'s replays,
``lbsgd.bench.torchrun``'s agents) gives it a :class:`Policy`, whose methods :meth:`Runner.run`
calls in order (prepare, start, ended, watch; interrupted on a ``KeyboardInterrupt``).
No torch here: ``import lbsgd.lab.experiments`` stays cheap."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

POLL_S = 0.2  # seconds between two looks at the running jobs


class Process(Protocol):
    """A job's process as the runner sees it: a ``subprocess.Popen``, or a scheduler's job."""

    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self) -> int: ...


@dataclass(eq=False)
class Job(Generic[T]):
    """One job: the caller's ``item`` (a run's config, a committed run, a node rank), its place
    among the runner's jobs (``number``, from 1), its process once started (``proc``; ``started``:
    ``time.perf_counter()`` then), and ``done``: its end was handed to the policy (or it was
    settled without a process)."""

    item: T
    number: int
    proc: Process | None = None
    started: float = 0.0
    done: bool = False

    @property
    def seconds(self) -> float:
        """Seconds since it started."""
        return time.perf_counter() - self.started


class Policy(Generic[T]):
    """What a caller decides about its jobs. :meth:`start` is the one a caller must give; the other
    hooks' defaults do nothing (all at most ``parallel`` at a time, an interrupt raised as it
    came)."""

    parallel: int = 1  # jobs running at a time

    def prepare(self, runner: Runner[T]) -> None:
        """Before any job starts: e.g. settle the jobs that need no process (:meth:`Runner.settle`)."""

    def start(self, job: Job[T]) -> Process:
        """Start ``job``'s process."""
        raise NotImplementedError

    def started(self, job: Job[T]) -> None:
        """``job`` has its process (``job.proc``): e.g. say so."""

    def may_start(self) -> bool:
        """Whether to start more jobs (e.g. not once one has failed)."""
        return True

    def ended(self, job: Job[T]) -> None:
        """``job``'s process ended, with ``job.proc.returncode``."""

    def watch(self, runner: Runner[T]) -> bool:
        """After each poll while jobs run: True stops waiting for them (they run on; the caller
        stops them)."""
        return False

    def interrupted(self, runner: Runner[T]) -> BaseException | None:
        """On an interrupt: stop :attr:`Runner.running` as the caller wants; the exception to raise
        (None: the interrupt itself)."""
        return None


class Runner(Generic[T]):
    """Runs one process per item of ``items`` under ``policy`` (see the module)."""

    def __init__(self, items: Iterable[T], policy: Policy[T], poll_s: float = POLL_S) -> None:
        if policy.parallel < 1:
            raise ValueError(f"parallel={policy.parallel} must be at least 1")
        self.policy, self.poll_s = policy, poll_s
        self.jobs = [Job(item, number) for number, item in enumerate(items, 1)]

    @property
    def pending(self) -> list[Job[T]]:
        """The jobs not started (nor settled), in order."""
        return [j for j in self.jobs if j.proc is None and not j.done]

    @property
    def running(self) -> list[Job[T]]:
        """The jobs started whose end the policy has not been given, in the order they started."""
        return [j for j in self.jobs if j.proc is not None and not j.done]

    def settle(self, job: Job[T]) -> None:
        """``job`` needs no process (its work is done already): it is never started."""
        job.done = True

    def run(self) -> None:
        """Run the jobs until each has ended, the policy starts no more and none runs, or
        ``policy.watch`` says to stop waiting; an interrupt goes to ``policy.interrupted``."""
        try:
            self.policy.prepare(self)
            self._wait()
        except KeyboardInterrupt:
            error = self.policy.interrupted(self)
            if error is None:
                raise
            raise error from None

    def _wait(self) -> None:
        while self.pending or self.running:
            self._fill()
            if not self.running:
                return  # the policy starts no more
            time.sleep(self.poll_s)
            for job in [j for j in self.running if j.proc.poll() is not None]:
                job.done = True
                self.policy.ended(job)
            if self.running and self.policy.watch(self):
                return

    def _fill(self) -> None:
        policy = self.policy
        while self.pending and len(self.running) < policy.parallel and policy.may_start():
            job = self.pending[0]
            job.proc = policy.start(job)
            job.started = time.perf_counter()
            policy.started(job)
