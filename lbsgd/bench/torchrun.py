"""Run ``lbsgd <args>`` in every process of torchrun agents on this machine, and never hang.

torchrun stops its group when a worker fails, but not when one exits 0 while another still waits
(a deadlock, or a peer gone). :func:`torchrun` therefore watches every worker (each records its pid
and exit status, :func:`run_worker`), gives the rest a grace period once any has exited, then dumps
the stacks of those still running and kills them; on any failure it says in one line which rank
failed first and how (:meth:`_Agents.report`). The benchmarks that need several processes
(``lbsgd bench allreduce``, ``bench train --nproc``, ``bench noise``'s ddp layout) start them here.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lbsgd import jobs, launch

# How long the other workers may take to exit once one has exited or an agent has stopped: then
# the ones still running are taken to hang, and are stopped and reported.
EXIT_GRACE_S = 60.0
_STATUS_DIR = "LBSGD_WORKER_STATUS_DIR"
# What each worker runs (torchrun --no-python): run_worker, with Python's stacks on a crash and on
# SIGUSR1 (the launcher's question to a worker that hangs), written to its stderr.
WORKER = (
    "import faulthandler, signal, sys; faulthandler.enable(); "
    "faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "from lbsgd.bench.torchrun import run_worker; run_worker(sys.argv[1:])"
)
# torchrun's summary of failed workers (torch.distributed.elastic's ChildFailedError): each one's
# rank and exit code, and the first failure it saw
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
_ROOT_CAUSE = re.compile(r"Root Cause[^\n]*\n(?:[^\n]*\n){0,4}?\s*rank\s*:\s*(\d+)")
_SIGNALS = {s.value for s in signal.Signals}
_STOPS = {signal.SIGTERM, signal.SIGKILL, signal.SIGINT}  # how torchrun (or a person) stops one


def run_worker(argv: list[str]) -> None:
    """One worker of :func:`torchrun`: ``lbsgd <argv>``, with its pid and then its exit status in
    ``$LBSGD_WORKER_STATUS_DIR/rank<RANK>.pid|.exit``, for the launcher to tell a worker that has
    exited (and with what) from one that is still running."""
    where = Path(os.environ[_STATUS_DIR]) / f"rank{os.environ['RANK']}"
    where.with_suffix(".pid").write_text(str(os.getpid()))
    code: int = 1
    sys.argv = ["lbsgd", *argv]
    try:  # python -m lbsgd: its exit status arrives as SystemExit
        runpy.run_module("lbsgd", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        raise
    finally:
        where.with_suffix(".exit").write_text(str(code))


def torchrun(
    nodes: int,
    per_node: int,
    args: list[str],
    what: str = "lbsgd",
    grace_s: float = EXIT_GRACE_S,
    log: Path | None = None,
) -> None:
    """Run ``lbsgd <args>`` (:func:`run_worker`) on ``nodes`` torchrun agents of ``per_node``
    processes on this machine (static rendezvous on 127.0.0.1: node ranks 0 …), never hanging
    (the module says how): once any worker or agent has exited, the rest get ``grace_s`` seconds.
    On any failure each failed rank's exit code (or "still running") and last stderr lines go to
    stderr, and SystemExit carries one line, prefixed ``what``. ``log``: a file the workers'
    output is appended to instead of this process's stdout and stderr (the failure's lines still
    come here).
    """
    with (
        tempfile.TemporaryDirectory(prefix="lbsgd-torchrun-") as tmp,
        open(log, "a") if log is not None else contextlib.nullcontext() as sink,
    ):
        agents = _Agents(nodes, per_node, args, Path(tmp), grace_s, sink)
        runner = jobs.Runner(range(nodes), agents)
        try:
            runner.run()
        finally:
            codes = agents.end_all(runner)
        if agents.hung is None and not any(codes):
            return
        report = agents.report(codes)
    raise SystemExit(f"{what}: {report}")


class _Forward(threading.Thread):
    """Copies an agent's stderr to ours line by line (a notebook shows it too), keeping the last
    lines: torchrun's summary of a failed worker."""

    def __init__(self, stream, sink=None) -> None:
        super().__init__(daemon=True)
        self.stream, self.sink, self.lines = stream, sink, collections.deque(maxlen=400)

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line)
            out = self.sink or sys.stderr
            out.write(line)
            out.flush()


class _Agents(jobs.Policy[int]):
    """The agents' policy for their runner (:mod:`lbsgd.jobs`): every agent at once (a job's item:
    its node rank), its stderr forwarded (:class:`_Forward`), watched as :func:`torchrun` says
    (``hung``: the ranks still running after the grace, rank to pid). ``tmp``: where the workers'
    status files and torchrun's logs go; ``sink``: where the workers' output goes, else ours."""

    def __init__(
        self, nodes: int, per_node: int, args: list[str], tmp: Path, grace_s: float, sink=None
    ) -> None:
        self.parallel, self.per_node, self.grace_s, self.sink = nodes, per_node, grace_s, sink
        self.endpoint = f"{launch.HOST}:{launch.free_port()}"
        self.status, self.logs = tmp / "status", tmp / "logs"
        self.status.mkdir()
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", _STATUS_DIR: str(self.status)}
        self.worker = ["--no-python", sys.executable, "-u", "-c", WORKER, *args]
        self.tails: list[_Forward] = []
        self.first_exit: float | None = None
        self.hung: dict[int, int] | None = None

    def start(self, job: jobs.Job[int]) -> subprocess.Popen:
        options = ["--tee=2", f"--log-dir={self.logs / str(job.item)}"]
        launcher = launch.torchrun(
            self.per_node,
            nnodes=self.parallel,
            endpoint=self.endpoint,
            node_rank=job.item,
            options=options,
        )
        return subprocess.Popen(
            [*launcher, *self.worker],
            env=self.env,
            stdout=self.sink,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )

    def started(self, job: jobs.Job[int]) -> None:
        self.tails.append(_Forward(job.proc.stderr, self.sink))
        self.tails[-1].start()

    def ended(self, job: jobs.Job[int]) -> None:
        if self.first_exit is None:
            self.first_exit = time.monotonic()

    def watch(self, runner: jobs.Runner[int]) -> bool:
        if self.first_exit is None and any(self.status.glob("*.exit")):
            self.first_exit = time.monotonic()
        if self.first_exit is None or time.monotonic() - self.first_exit <= self.grace_s:
            return False
        self.hung = {r: pid for r, pid in _pids(self.status).items() if _alive(pid)}
        for pid in self.hung.values():
            _signal(pid, signal.SIGUSR1)  # faulthandler: its stacks to its stderr log
        time.sleep(2)
        _kill_workers(self.status)
        return True

    def end_all(self, runner: jobs.Runner[int]) -> list[int]:
        """Every agent started ended (killed with its workers where still running), their output
        forwarded; their exit codes."""
        started = [j.proc for j in runner.jobs if j.proc is not None]
        for a in started:  # nothing is left behind, on any exit (Ctrl-C included)
            if a.poll() is None:
                _kill_workers(self.status)
                a.kill()
            a.wait()
        for t in self.tails:
            t.join(timeout=5)
        return [a.returncode for a in started]

    def report(self, codes: list[int]) -> str:
        """Each failed rank's state (exit code, or still running) and last stderr lines, to
        stderr; back, one line: the first failure (a crash, else the first rank to exit non-zero,
        else torchrun's root cause, else a rank that hung) with its telling stderr line, then
        every other rank's state. ``codes``: the agents' exit codes."""
        world, hung = self.parallel * self.per_node, self.hung or {}
        agent_err = "".join(line for t in self.tails for line in t.lines)
        exits, exited_at = _exits(self.status, agent_err)
        started = _pids(self.status)
        states = {r: _state(r, hung, exits, started, self.grace_s) for r in range(world)}
        if not started and not exits:
            return f"torchrun exited with {codes} before any worker started (its output is above)"
        failed = [r for r in range(world) if states[r] != "exited with 0"]
        tails = self._print_tails(failed, states, hung)
        if not failed:  # every worker exited 0, but an agent failed or did not exit
            parts = ", ".join(f"rank {r} {states[r]}" for r in range(world))
            return f"{parts}; torchrun agents exited with {codes}"
        roots = {int(r) for r in _ROOT_CAUSE.findall(agent_err)}
        first = min(failed, key=lambda r: _cause(r, exits, exited_at, roots, hung))
        return _first_and_others(first, _telling(tails[first], first in hung), states)

    def _print_tails(
        self, failed: list[int], states: dict[int, str], hung: dict[int, int]
    ) -> dict[int, list[str]]:
        """Each failed rank's state and last stderr lines (of torchrun's log of it, the non-empty
        ones: 25 of a rank that hung, else 15), to stderr; the lines, by rank."""
        tails = {}
        noise = ("Extension modules:", "(total: ")  # faulthandler's list of loaded modules
        for rank in failed:
            node, local = divmod(rank, self.per_node)
            files = sorted(self.logs.glob(f"{node}/*/attempt_*/{local}/stderr.log"))
            lines = files[-1].read_text(errors="replace").splitlines() if files else []
            lines = [t for t in lines if t.strip() and not t.startswith(noise)]
            tails[rank] = lines[-(25 if rank in hung else 15) :]
            print(f"--- rank {rank}: {states[rank]}; last stderr lines:", file=sys.stderr)
            for line in tails[rank] or ["(none)"]:
                print(f"  {line}", file=sys.stderr)
        sys.stderr.flush()
        return tails


def _pids(status: Path) -> dict[int, int]:
    out = {}
    for f in status.glob("rank*.pid"):
        with contextlib.suppress(ValueError, OSError):
            out[int(f.stem[4:])] = int(f.read_text())
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its agent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _kill_workers(status: Path) -> None:
    for pid in _pids(status).values():
        if _alive(pid):
            _signal(pid, signal.SIGKILL)


def _exits(status: Path, agent_err: str) -> tuple[dict[int, int], dict[int, float]]:
    """Each rank's exit code and when it exited (its ``.exit`` file), and the codes torchrun's
    summary gives for the ranks a signal killed (no ``.exit`` file of their own)."""
    exits, exited_at = {}, {}
    for f in status.glob("rank*.exit"):
        with contextlib.suppress(ValueError, OSError):
            exits[int(f.stem[4:])] = int(f.read_text())
            exited_at[int(f.stem[4:])] = f.stat().st_mtime
    for rank, code in _FAILURE.findall(agent_err):
        exits.setdefault(int(rank), int(code))
    return exits, exited_at


def _state(
    rank: int, hung: dict[int, int], exits: dict[int, int], started: dict[int, int], grace_s: float
) -> str:
    """One rank's state, in words: hung (and killed), exited (with the signal's name), or not."""
    if rank in hung:
        return f"still running {grace_s:g} s after a worker exited (killed)"
    if rank in exits:
        code = exits[rank]
        sig = f" ({signal.Signals(-code).name})" if -code in _SIGNALS else ""
        return f"exited with {code}{sig}"
    return "ended without an exit status" if rank in started else "never started"


def _first_and_others(first: int, line: str, states: dict[int, str]) -> str:
    """The first failure with its telling line, then every other rank's state."""
    others = [f"rank {r} {s}" for r, s in states.items() if r != first]
    return f"rank {first} {states[first]}{': ' + line if line else ''}" + (
        f"; {', '.join(others)}" if others else ""
    )


def _cause(
    r: int, exits: dict[int, int], exited_at: dict[int, float], roots: set[int], hung: dict
) -> tuple:
    """Rank ``r``'s order as a failure's cause: a crash, an error exit (the first), torchrun's
    root cause, a hang, the rest."""
    crash = exits.get(r, 0) < 0 and -exits[r] not in _STOPS
    error = r in exited_at and exits[r] != 0
    rank = 0 if crash else 1 if error else 2 if r in roots else 3 if r in hung else 4
    return rank, exited_at.get(r, 0.0), r


def _telling(tail: list[str], hung: bool) -> str:
    """The line of a failed worker's stderr that says most: faulthandler's fatal error and the
    innermost frame (the line after its last "Current thread"), a hung worker's innermost frame,
    else the last line."""
    starts = [i for i, t in enumerate(tail) if t.startswith("Current thread")]
    frame = tail[starts[-1] + 1].strip() if starts and starts[-1] + 1 < len(tail) else ""
    fatal = [t for t in tail if t.startswith("Fatal Python error")]
    if fatal:
        return fatal[-1].strip() + (f", at {frame}" if frame else "")
    if hung and frame:
        return f"at {frame}"
    return tail[-1].strip() if tail else ""
