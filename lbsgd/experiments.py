"""The notebook-facing API: launch sweeps of runs through torchrun, load their results, compare.

A study (one notebook) describes its runs as flat dicts of config keys and hands them to
:func:`sweep`, which

- validates every run's config first, with the launch parameters, the data directories, the
  process layout and the run directories (bad input stops the sweep with one line before anything
  starts, and no file is touched; a finished run of other experiment keys under the same name is
  refused, not skipped),
- writes ``profile`` and ``varied`` (the keys whose values differ across the runs, ``k`` for
  ``batch_size``) into every run's config: W&B's tags and display names,
- skips runs already complete in ``out_dir/study/`` and copies an identical run (same experiment
  keys) completed by another study of ``out_dir`` (the same profile) instead of training it again
  (the copy's config.yaml and summary.json name this study, ``study``, and the run copied,
  ``copied_from: <study>/<run>``; W&B gets it in this study's group),
- starts each remaining run as ``python -m torch.distributed.run … -m lbsgd train key=value …``
  with ``resume=true`` (a stopped run continues from its checkpoint) and ``--max-restarts``
  ``max_restarts`` (torchrun restarts a group that lost a worker; the group resumes)
  (a one-process run as ``python -m lbsgd train key=value …``: the same trainer, without the
  agent's few seconds of start-up)
  (worker code never lives in a notebook), ``parallel`` at a time, with the output of each in
  ``out_dir/study/<run>.log`` (appended: each attempt begins with a line saying when it began and
  whether it resumes from a checkpoint),
- numbers each run once, ``[i/N]`` by its place in ``runs``, and prints it on every line of that
  run: ``skipped``, ``copied``, ``resumed`` (a checkpoint exists) or ``started``, then, for a run
  it trains, one line when it ends (status, cost, error, how many of the N are done),
- records a diverged run and goes on; a run that fails raises :class:`RunFailed` naming the run
  and its log, once the runs in flight have finished,
- on an interrupt (Ctrl-C, Jupyter's Kernel > Interrupt, SIGTERM to the sweep's process: the runs,
  in sessions of their own, do not see it) asks every running run to stop with SIGTERM (torchrun
  passes it on to its workers; each stops at its next metric flush with a checkpoint, status
  ``interrupted``), waits for them, prints one line per run stopped or not started and raises
  :class:`RunInterrupted`, whose one line sums up (IPython, hence Jupyter and papermill, shows that
  line and no traceback); a SIGTERM then goes on to its earlier handler (by default the process
  ends). The same sweep again resumes the runs. A second interrupt (not a SIGTERM) while waiting
  kills them (each keeps its last checkpoint). A run whose sweep dies without a word (a killed kernel) is
  sent SIGTERM by the system (Linux), not orphaned,

and returns :func:`load_runs` of the study: one row per run, every key, derived value and summary
field. Everything here reads the local results only: no W&B server is needed to compare runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from lbsgd import config, jobs, launch, registry, rundir, tracking
from lbsgd.config import Config
from lbsgd.tracking import flatten

DONE = ("completed", "diverged")  # statuses that end a run for good
# what a copy from another study leaves behind: checkpoints, W&B's files and its run id
COPY_IGNORE = shutil.ignore_patterns("checkpoint*.pt", ".checkpoint.pt.tmp", "wandb", "wandb_id")
# Run keys that name this study's copy of a run (the rest of config.yaml is the twin's)
COPY_RUN_KEYS = ("out_dir", "study", "profile", "varied")
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


class RunFailed(RuntimeError):
    """A run of a sweep ended with an error (not a divergence)."""


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


class _Terminated(KeyboardInterrupt):
    """SIGTERM to the sweep: an interrupt that asks the runs to stop, never to hurry."""


# The first line of each attempt in a run's log (the sweep appends: earlier attempts stay)
ATTEMPT_MARK = "==== attempt "


@dataclass(eq=False)
class _Run:
    """A run of the sweep, as the runner's job item (:class:`lbsgd.jobs.Job`; its ``number`` is
    the run's place in the sweep's runs: the [number/total] of each of its lines): its config,
    its log, the log's handle while it runs, and how its attempt starts."""

    cfg: Config
    log: Path
    handle: Any = field(default=None, repr=False)
    how: str = ""


_Job = jobs.Job[_Run]


def shown(path: Path) -> str:
    """``path`` as a sweep's line shows it: relative to the working directory when it lies under
    it (``make reproduce`` runs in the repository: results/<profile>/<study>/<run>.log, the same
    on every machine, so an executed notebook holds no machine's absolute path), else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass
class _Progress:
    """The sweep's lines: each names its run by its one number, ``[i/N]``."""

    total: int
    say: Any
    done: int = 0  # runs skipped, copied or ended

    def line(self, job: _Job, text: str) -> None:
        self.say(f"[{job.number}/{self.total}] {job.item.cfg.run_name()}: {text}")

    def end(self, job: _Job, text: str, tally: bool = True) -> None:
        """The line of a run that needs nothing more (``tally``: with how many of N are done)."""
        self.done += 1
        self.line(job, f"{text} ({self.done} of {self.total} done)" if tally else text)


# Run keys that change what a run records, not what it trains: a twin must have recorded the same
MEASUREMENT_KEYS = ("noise_scale", "noise_scale_batch", "noise_scale_ema")


def find_identical(cfg: Config, root: Path, world_size: int = 1) -> Path | None:
    """A finished run with the same experiment keys in another study of ``root`` (the runs'
    ``out_dir``: one profile's folder, so a run of another profile is never taken) that recorded
    the same measurements (:data:`MEASUREMENT_KEYS`, as its config.yaml has them) and, when the
    number of processes is part of the mathematics (:func:`lbsgd.config.world_size_key`), ran on
    ``world_size`` processes."""
    name = cfg.run_name()
    key = config.world_size_key(cfg)
    want = {k: getattr(cfg, k) for k in MEASUREMENT_KEYS}
    default = {k: config.FIELDS[k].default for k in MEASUREMENT_KEYS}
    for other in sorted(root.glob(f"*/{name}")):
        if other.parent.name != cfg.study and rundir.read_status(other) in DONE:
            try:
                theirs = json.loads((other / "summary.json").read_text()).get("experiment_id")
                keys = config.read_yaml(other / "config.yaml", derived=True)
            except (OSError, ValueError, config.ConfigError):
                continue
            recorded = {k: keys.get(k, default[k]) for k in MEASUREMENT_KEYS}
            same_k = key is None or keys.get("world_size") == world_size
            if theirs == cfg.experiment_id() and recorded == want and same_k:
                return other
    return None


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


def _command(
    cfg: Config, nproc_per_node: int, nnodes: int, rdzv_endpoint: str | None, max_restarts: int = 0
) -> list[str]:
    overrides = [f"{k}={_text(v)}" for k, v in cfg.to_dict().items() if v is not None]
    if nproc_per_node == 1 and nnodes == 1:  # one process: the same trainer, no agent to start
        return [sys.executable, "-m", "lbsgd", "train", *overrides]
    launcher = launch.torchrun(
        nproc_per_node, nnodes=nnodes, endpoint=rdzv_endpoint, max_restarts=max_restarts
    )
    return [*launcher, "-m", "lbsgd", "train", *overrides]


def varied_keys(cfgs: Sequence[Config]) -> tuple[str, ...]:
    """The keys whose values differ across ``cfgs``, sorted, ``k`` standing for ``batch_size``
    (``name`` left out: a run's folder name, not a key it was trained with)."""
    dicts = [c.to_dict() for c in cfgs]
    keys = {
        k
        for k in dicts[0]
        if k not in ("name", "varied") and any(d[k] != dicts[0][k] for d in dicts[1:])
    }
    if "batch_size" in keys:
        keys = (keys - {"batch_size"}) | {"k"}
    return tuple(sorted(keys))


def _copy_run(twin: Path, cfg: Config) -> None:
    """``twin`` (a finished run of another study) as ``cfg``'s run: its records, with config.yaml's
    run keys naming this study (the copy's W&B group, tags and display name), and config.yaml and
    summary.json both saying ``study``: this one, ``copied_from``: ``<study>/<run>`` of the twin
    (its experiment keys, name and ``experiment_id`` are the twin's). Written under a temporary
    name first: an interrupted copy leaves no half run behind."""
    import yaml

    run_dir = cfg.run_dir()
    origin = f"{twin.parent.name}/{twin.name}"
    tmp = run_dir.with_name(f".{run_dir.name}.copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(twin, tmp, ignore=COPY_IGNORE)
    values = yaml.safe_load((tmp / "config.yaml").read_text()) or {}
    ours = cfg.to_dict()
    values.update({k: ours[k] for k in COPY_RUN_KEYS})
    aside = (*config.DERIVED_KEYS, *config.RECORD_KEYS)
    keys = {k: v for k, v in values.items() if k not in aside}
    derived = {k: v for k, v in values.items() if k in config.DERIVED_KEYS}
    text = yaml.safe_dump(keys, sort_keys=False)
    if derived:
        text += "# derived (lbsgd.config.derive)\n" + yaml.safe_dump(derived, sort_keys=False)
    text += "# copied by a sweep (lbsgd.experiments): the records are this run's of another study\n"
    text += yaml.safe_dump({"copied_from": origin}, sort_keys=False)
    (tmp / "config.yaml").write_text(text)
    summary = rundir.read_summary(tmp)  # a copy of a copy: its copied_from replaced
    rundir.write_summary(tmp, {**summary, "study": cfg.study, "copied_from": origin})
    os.replace(tmp, run_dir)


def _text(v: Any) -> str:
    if isinstance(v, list | tuple):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def sweep(
    study: str,
    runs: Sequence[Mapping[str, Any]],
    *,
    out_dir: str | os.PathLike = "results",
    nproc_per_node: int = 1,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    parallel: int = 1,
    wandb: str = "auto",
    max_restarts: int = 0,
    quiet: bool = False,
    profile: str | None = None,
):
    """Train every run of ``runs`` (dicts of config keys) into ``out_dir/study``; see the module.

    ``profile`` (the study's scale) is written into every run's config, as is ``varied``."""
    config.check_folder_name("study", study)  # its folder is made even for no runs
    config.check_place(out_dir, study)
    check_launch(
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        parallel=parallel,
        max_restarts=max_restarts,
    )
    base = {
        "study": study,
        "out_dir": str(out_dir),
        "wandb": wandb,
        "resume": True,
        "profile": profile,
    }
    runs = config.run_list(runs)
    cfgs = [config.from_dict({**base, **r}) for r in runs]  # before any work
    # a user's own runs: no key that their setting ignores (a study's are whole profiles)
    if profile is None:
        for c, r in zip(cfgs, runs, strict=True):
            config.check_ignored(c, r)
    if cfgs:
        varied = varied_keys(cfgs)
        cfgs = [c.replace(varied=varied) for c in cfgs]
    names = [c.run_name() for c in cfgs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise config.ConfigError(f"runs of study {study!r} repeat the same experiment: {dup}")
    from lbsgd import entry  # torch: imported once the cheap checks have passed

    for c in cfgs:  # data directories, process layout, run directories: read only
        registry.import_plugins(c.plugins)  # a plugin's model or dataset, as the run will see it
        entry.check(c, nproc_per_node * nnodes, nproc_per_node)
        # a finished run of other experiment keys (or of another K, under local SGD) is not "done"
        rundir.check_run_dir(c, nproc_per_node * nnodes)
    study_dir = Path(out_dir) / study
    study_dir.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, flush=True))

    with _sigterm_as_interrupt() as terminated:
        policy = _Sweep(
            study,
            _Progress(len(cfgs), say),
            command=lambda c: _command(c, nproc_per_node, nnodes, rdzv_endpoint, max_restarts),
            root=Path(out_dir),
            world_size=nproc_per_node * nnodes,
            wandb=wandb,
            terminated=terminated,
            parallel=parallel,
        )
        jobs.Runner([_Run(c, study_dir / f"{c.run_name()}.log") for c in cfgs], policy).run()
    if policy.failed:
        raise RunFailed(" | ".join(policy.failed))
    return load_runs(study_dir, names=names)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM to the sweep's process (a scheduler, a kernel shut down by papermill or Jupyter) as
    an interrupt while the sweep runs: the runs stop with a checkpoint and each is named; then the
    signal goes on to the handler it had before (by default the process ends, exit status 143, as
    it would have: a kernel being shut down sends no reply on its closed sockets). Yields the
    signals caught (empty: none). Python lets only the main thread set a handler; elsewhere, or
    where SIGTERM is ignored, it is left as it is."""
    caught: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or before == signal.SIG_IGN:
        yield caught
        return

    def interrupt(signum, frame):
        caught.append(signum)
        raise _Terminated(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield caught
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
        if caught:
            # a kernel's output leaves through a socket thread: time for the last lines to go
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class _Sweep(jobs.Policy[_Run]):
    """The sweep's policy for its runner (:mod:`lbsgd.jobs`): runs settled first (skipped, copied),
    the others started ``parallel`` at a time until one fails, each one's end said in a line (a
    failure added to ``failed``), and on an interrupt every run in flight stopped and named."""

    study: str
    progress: _Progress
    command: Any  # a run's config -> its command line
    root: Path  # the runs' out_dir: where a twin is looked for
    world_size: int
    wandb: str
    terminated: list[int]  # the SIGTERMs the sweep caught (_sigterm_as_interrupt)
    parallel: int = 1
    failed: list[str] = field(default_factory=list)

    def prepare(self, runner: jobs.Runner[_Run]) -> None:
        _settle(runner, self.progress, self.root, self.world_size, self.wandb)

    def start(self, job: _Job) -> subprocess.Popen:
        return _start(job.item, self.command)

    def started(self, job: _Job) -> None:
        self.progress.line(job, f"{job.item.how} (log: {shown(job.item.log)})")

    def may_start(self) -> bool:
        return not self.failed

    def ended(self, job: _Job) -> None:
        _ended(job, self.failed, self.progress)

    def interrupted(self, runner: jobs.Runner[_Run]) -> RunInterrupted:
        error = _interrupted(self.study, runner.running, runner.pending, self.failed, self.progress)
        if self.terminated:  # the process ends before anyone shows the error: its line here
            self.progress.say(f"{type(error).__name__}: {error}")
        return error


def _settle(
    runner: jobs.Runner[_Run], progress: _Progress, root: Path, world_size: int, wandb: str
) -> None:
    """Settle the runs already done here (skipped) and those another study of ``root`` completed
    (copied), one line each."""
    for job in runner.pending:
        c, run_dir = job.item.cfg, job.item.cfg.run_dir()
        status = rundir.read_status(run_dir)
        if status in DONE:
            runner.settle(job)
            progress.end(job, f"skipped (already {status})", tally=False)
            continue
        twin = None if run_dir.exists() else find_identical(c, root, world_size)
        if twin is not None:
            _copy_run(twin, c)
            runner.settle(job)
            progress.end(job, f"copied from {twin.parent.name}/ (identical run)", tally=False)
            # W&B: the copy in this study's group too (never fails the sweep)
            tracking.log_copied_run(run_dir, copied_from=twin, mode=wandb, project=c.wandb_project)


def _start(run: _Run, command) -> subprocess.Popen:
    """Start one run, its output appended to its log after a line that begins the attempt."""
    run.how = _how_it_starts(run.cfg.run_dir())
    run.handle = run.log.open("a")
    run.handle.write(f"{_attempt_line(run.log, run.how)}\n")
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


def _how_it_starts(run_dir: Path) -> str:
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


def _attempt_line(log: Path, how: str) -> str:
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


def _ended(job: _Job, failed: list[str], progress: _Progress) -> None:
    """The line of a run that ended; a failure is added to ``failed``."""
    run = job.item
    run.handle.close()
    rc, secs = job.proc.returncode, job.seconds
    status = rundir.read_status(run.cfg.run_dir())
    # torchrun reports any failed worker as exit code 1, so the run's own record decides:
    # a diverged run (trainer exit code 3) is a result, not a failure
    if status in DONE:
        progress.end(job, f"{status} in {secs:.0f} s{result_text(run.cfg.run_dir())}")
        return
    failed.append(
        f"run {run.cfg.run_name()} failed (exit code {rc}); log: {shown(run.log)}; "
        f"error: {_error_line(run.log)}"
    )
    progress.end(job, f"FAILED, see {shown(run.log)}")


def _interrupted(
    study: str, running: list[_Job], todo: list[_Job], failed: list[str], progress: _Progress
) -> RunInterrupted:
    """Stop the runs in flight (``running``: each started, the last perhaps as the interrupt came)
    as a scheduler would (SIGTERM: checkpoint at an agreed step, status interrupted), wait for
    them, say where each stands and which of ``todo`` were not started, one line each; the
    exception to raise, whose one line sums up."""
    killed = _stop(running, progress.say)
    for job in running:
        job.item.handle.close()
        progress.line(job, f"{_stop_text(job.item.cfg.run_dir())} (log: {shown(job.item.log)})")
    for job in todo:
        progress.line(job, "not started")
    parts = [f"{_runs(len(running))} {'killed' if killed else 'stopped'}"] if running else []
    parts += [f"{_runs(len(todo))} not started"] if todo else []
    parts += [f"{_runs(len(failed))} failed before the interrupt"] if failed else []
    return RunInterrupted(
        f"sweep of study {study!r} interrupted: {', '.join(parts) or 'no run in flight'}; "
        "run the same sweep again to resume",
        [j.item.cfg.run_name() for j in (*running, *todo)],
    )


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _stop(running: list[_Job], say) -> bool:
    """SIGTERM to every run in flight (torchrun's agent passes it on to its workers), then wait for
    them; a second interrupt (not a SIGTERM: a kernel manager sends one a few seconds after its
    interrupt) kills them (SIGKILL) instead. Whether they were killed."""
    for job in running:
        if job.proc.poll() is None:
            job.proc.send_signal(signal.SIGTERM)
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
        except _Terminated:  # asked to end, not to hurry: the runs go on to their checkpoint
            continue
        except KeyboardInterrupt:  # asked twice: no waiting for the next flush
            _kill(running)
            return True


def _kill(running: list[_Job]) -> None:
    for job in running:
        if job.proc.poll() is None:
            try:
                os.killpg(job.proc.pid, signal.SIGKILL)  # its own session: torchrun's workers
            except OSError:
                job.proc.kill()
    for job in running:
        job.proc.wait()


def _stop_text(run_dir: Path) -> str:
    """Where a stopped run stands, from its summary.json: status, step, checkpoint."""
    from lbsgd import checkpoint  # torch: already imported by the sweep's checks

    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return "stopped before training began"
    status, steps = s.get("status"), s.get("steps")
    kept = (run_dir / checkpoint.NAME).exists()
    if status in DONE:
        return f"{status} at step {steps}"
    if status == "interrupted":
        return f"interrupted at step {steps}, " + ("checkpoint kept" if kept else "no checkpoint")
    return f"status {status} at step {steps}, " + (
        "resumes from its last checkpoint" if kept else "no checkpoint: restarts"
    )


def _error_line(log: Path) -> str:
    """The most telling line of a failed run's log (its last attempt): the last one naming an
    error."""
    lines = log.read_text(errors="replace").splitlines()
    marks = [i for i, ln in enumerate(lines) if ln.startswith(ATTEMPT_MARK)]
    lines = [ln.strip() for ln in lines[marks[-1] + 1 if marks else 0 :] if ln.strip()]
    for ln in reversed(lines):
        if ("Error" in ln or "error:" in ln) and not ln.startswith("torch.distributed"):
            return ln
    useful = [ln for ln in lines if not set(ln) <= set("=-")]
    return useful[-1] if useful else "(empty log)"


def result_text(run_dir: Path) -> str:
    """The end of a run's sweep line: its final top-1 error and speed. A run with a held-out split
    shows that split's error only: a tuning trial is chosen by it, and its test error is the
    study's to report (for the chosen settings alone), not the sweep's."""
    s = json.loads((run_dir / "summary.json").read_text())
    final = s.get("final", {})
    val = final.get("val_top1_error_pct")
    err = final.get("top1_error_pct")
    ips = s.get("img_per_s")
    parts = []
    if val is not None:
        parts.append(f"held-out top-1 error {val:.1f}%")
    elif err is not None:
        parts.append(f"top-1 error {err:.1f}%")
    if ips:
        parts.append(f"{ips:.0f} img/s")
    return (", " + ", ".join(parts)) if parts else ""


# -- reading results --------------------------------------------------------------------------


def run_record(run_dir: str | os.PathLike) -> dict[str, Any]:
    """One run as a flat dict: config keys, derived values, summary (``final_*``, ``best_*``, …).
    A key the run's config.yaml lacks (added to the vocabulary after the run) has its default:
    the value the run trained with. ``study`` is the study the run serves (config.yaml's) and
    ``copied_from`` the ``<study>/<run>`` a sweep copied it from (None for a run trained here; a
    copy made before copied_from was recorded names the study its summary.json says trained it)."""
    import yaml

    run_dir = Path(run_dir)
    written: dict[str, Any] = yaml.safe_load((run_dir / "config.yaml").read_text())
    rec: dict[str, Any] = {**{k: f.default for k, f in config.FIELDS.items()}, **written}
    rec = {k: list(v) if isinstance(v, tuple) else v for k, v in rec.items()}
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("environment", None)
    trained_by = summary.get("study", rec["study"])
    rec.update(flatten(summary, sep="_"))
    rec["study"] = written.get("study", rec["study"])
    if rec.get("copied_from") is None and trained_by != rec["study"]:
        rec["copied_from"] = f"{trained_by}/{run_dir.name}"
    rec.setdefault("copied_from", None)
    rec["k"] = rec["batch_size"] / rec["reference_batch"]
    rec["run_dir"] = str(run_dir)
    return rec


def load_runs(study_dir: str | os.PathLike, names: Iterable[str] | None = None):
    """A pandas DataFrame of the runs in ``study_dir`` (those named, in order, if given)."""
    import pandas as pd

    study_dir = Path(study_dir)
    dirs = (
        [study_dir / n for n in names]
        if names is not None
        else sorted(p.parent for p in study_dir.glob("*/summary.json"))
    )
    return pd.DataFrame([run_record(d) for d in dirs if (d / "config.yaml").exists()])


def load_metrics(run_dir: str | os.PathLike, kind: str = "train"):
    """The ``metrics.jsonl`` records of one kind (train or eval) as a DataFrame."""
    import pandas as pd

    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return pd.DataFrame([r for r in map(json.loads, lines) if r.get("kind") == kind])


def reference(study: str | None = None):
    """The published numbers (the project's copy of the papers' tables), optionally one study's."""
    import pandas as pd

    with resources.files("lbsgd").joinpath("reference/paper_results.csv").open() as f:
        df = pd.read_csv(f)
    return df if study is None else df[df["study"] == study].reset_index(drop=True)


# -- tables and figures -----------------------------------------------------------------------


def summarize(df, by: Sequence[str], metric: str = "final_top1_error_pct"):
    """Mean, standard deviation and count of ``metric`` over the runs (seeds) of each group."""
    g = df.groupby(list(by), dropna=False)[metric]
    out = g.agg(["mean", "std", "count"]).reset_index()
    return out.rename(columns={"mean": f"{metric}_mean", "std": f"{metric}_std", "count": "runs"})


def study_dir(out_dir: str | os.PathLike, study: str) -> Path:
    config.check_folder_name("study", study)
    path = Path(out_dir) / study
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_table(table, out_dir: str | os.PathLike, study: str, name: str = "table.csv") -> Path:
    """``table`` as ``<study>/<name>``, every number to 6 significant digits (what the report and
    later readers read: :func:`readable` rounds only what is shown)."""
    config.check_folder_name("name", name)  # a file of the study's folder, nowhere else
    path = study_dir(out_dir, study) / name
    table.to_csv(path, index=False, float_format="%.6g")
    return path


# Columns in percentage points (errors, accuracies, efficiencies, their spreads and gaps): shown to
# 2 decimals; every other number to 4 significant digits.
POINTS_COLUMN = re.compile(r"_pct(_mean|_std)?$|_pts$|^paper_std$")


def readable_cell(column: str, value: Any) -> str:
    """One cell of a table as it is shown (a notebook's table, REPORT.md): a number of a
    :data:`POINTS_COLUMN` to 2 decimals, any other fraction to 4 significant digits (no exponent
    from 1 up), a whole number as it is, a missing one empty, text as it is. ``value``: a number
    or a CSV cell's text."""
    text = "" if value is None else str(value).strip()
    if text in ("True", "False", "<NA>"):  # numpy's booleans are numbers to float()
        return "" if text == "<NA>" else text
    try:
        x = float(text)
    except ValueError:
        return text
    if not math.isfinite(x):
        return "" if math.isnan(x) else text
    if POINTS_COLUMN.search(column):
        return f"{x:.2f}"
    if text.lstrip("+-").isdigit() or (x.is_integer() and abs(x) < 1e15):
        return str(int(x))
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def readable(table):
    """A copy of ``table`` (a DataFrame) for reading: every cell as :func:`readable_cell` shows
    it. The table itself, and the CSV that :func:`save_table` writes, keep full precision."""
    return table.apply(lambda col: col.map(lambda v: readable_cell(str(col.name), v)))


def save_figure(fig, out_dir: str | os.PathLike, study: str, name: str) -> Path:
    config.check_folder_name("name", name)  # a file of the study's folder, nowhere else
    path = study_dir(out_dir, study) / name
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_curves(
    df, label: str, metric: str = "loss", kind: str = "train", ax=None, smooth: int = 1
):
    """Training (or eval) curves of the runs in ``df``, against epochs, one line per row."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for _, row in df.iterrows():
        m = load_metrics(row["run_dir"], kind)
        if m.empty:
            continue
        y = m[metric].astype(float)
        if smooth > 1:
            y = y.rolling(smooth, min_periods=1).mean()
        ax.plot(m["epoch"], y, label=str(row[label]))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric if kind == "train" else f"test {metric}")
    ax.legend(fontsize=8)
    return ax
