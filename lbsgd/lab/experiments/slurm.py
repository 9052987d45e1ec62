"""Slurm as a sweep's launcher (``launcher="slurm"``, :class:`SlurmLauncher`): each run one Slurm
job, submitted with submitit, the sweep's runner (:mod:`lbsgd.jobs`) keeping ``parallel`` in
flight; docs/cluster.md is the user's page. :class:`Cluster` is a checked cluster file,
:class:`TrainJob` what runs on each task (requeued only after the trainer checkpointed on the
pre-emption signal), :class:`SlurmProc` a job as the runner sees a process (its state from
``squeue``). A run's job id under the study's ``.slurm/<run>/`` lets a sweep started again attach
to its job instead of submitting a duplicate.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal as signals
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import Field

from lbsgd import config, launch, rundir
from lbsgd.config import Config, ConfigError
from lbsgd.lab.experiments import commands
from lbsgd.lab.experiments.commands import SweepJob, SweepRun, train_args
from lbsgd.lab.experiments.interrupts import RunInterrupted, stop_text
from lbsgd.lab.experiments.lines import Progress

CLUSTER_DIR = Path("configs") / "cluster"  # the cluster files' folder, under the repository
SIGNALS = ("USR1", "USR2")  # pre-emption signals the trainer stops on (lbsgd.cadence)
GONE = ""  # the state of a job no longer in the queue: it ended
# the states of a job that has ended for good (squeue -t all, for MinJobAge after its end); a
# pre-empted or failed node's job may be requeued, and a job that leaves the queue has ended too
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


class Cluster(pydantic.BaseModel):
    """Where and how a sweep's runs go as Slurm jobs: the allocation of each job (its nodes are the
    sweep's ``nnodes``, its processes per node ``nproc_per_node``), the pre-emption signal and its
    lead before the time limit, extra ``#SBATCH`` options, shell lines run before the trainer, the
    nodes' Python, and how often the queue is read."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_min: int = Field(60, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_task: int = Field(1, ge=1)
    mem_gb: float | None = None
    tasks_per_node: int = Field(1, ge=1)  # torchrun agents a node: 2 puts two "nodes" on one
    signal: Literal[SIGNALS] = "USR1"  # type: ignore[valid-type]
    signal_delay_s: int = Field(120, ge=1)
    sbatch: dict[str, Any] = {}  # e.g. {exclusive: true, mail-type: END}
    setup: list[str] = []  # e.g. ["module load cuda/12.4"]
    python: str | None = None  # the nodes' interpreter (default: this one)
    poll_s: float = 5.0

    @pydantic.model_validator(mode="after")
    def _signal(self) -> Cluster:
        if "signal" in self.sbatch:
            raise ValueError("sbatch's signal is the keys signal, signal_delay_s")
        if self.time_min * 60 <= self.signal_delay_s + 60:
            raise ValueError(
                f"time_min={self.time_min} leaves no minute of training before the pre-emption "
                f"signal's lead (signal_delay_s={self.signal_delay_s}): a job would be signalled "
                "before its first checkpoint"
            )
        return self


def cluster_of(spec: Cluster | str | os.PathLike | None, root: Path | None = None) -> Cluster:
    """The cluster of ``spec``: a Cluster, or ``"NAME [key=value ...]"`` (``NAME`` a file of
    ``root/configs/cluster/``, or a YAML path; values read as YAML). One line naming the key or
    file where anything is off."""
    if isinstance(spec, Cluster):
        return spec
    name, *overrides = str(spec or "").split() or [""]
    if not name:
        raise ConfigError("cluster=None: launcher=slurm needs a cluster file (docs/cluster.md)")
    keys = _read(name, root or Path.cwd())
    for w in overrides:
        key, sep, value = w.partition("=")
        if not sep:
            raise ConfigError(f"cluster override {w!r}: write key=value")
        keys[key] = _yaml(value, f"cluster override {w!r}")
    try:
        return Cluster(**keys)
    except pydantic.ValidationError as e:
        raise ConfigError(f"cluster {name!r}: {_one_line(e, keys)}") from None


def _read(name: str, root: Path) -> dict[str, Any]:
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = root / CLUSTER_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (root / CLUSTER_DIR).glob("*.yaml"))
        raise ConfigError(f"cluster={name!r}: no file {str(path)!r} (cluster files: {known})")
    keys = _yaml(path.read_text(), f"cluster file {str(path)!r}") or {}
    if not isinstance(keys, dict):
        raise ConfigError(f"cluster file {str(path)!r} must hold key: value lines")
    return keys


def _yaml(text: str, what: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{what} is not valid YAML: {why}") from None


def _one_line(e: pydantic.ValidationError, keys: dict[str, Any]) -> str:
    """pydantic's first error as the sweep's one line: ``key=value must be ...``."""
    err = e.errors()[0]
    key, msg = (err["loc"] or ("",))[0], err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unknown key {key!r} (keys: {sorted(Cluster.model_fields)})"
    one_of = "must be one of " if err["type"] == "literal_error" else "must be "
    return f"{key}={keys[key]!r} {msg.replace('Input should be ', one_of)}" if key else msg


def _partition(cluster: Cluster) -> None:
    """The cluster's partition (default: the default one) known to ``sinfo``, with a node that
    holds ``gpus_per_node`` GPUs."""
    rows = [r.split("|") for r in _slurm("sinfo", "-h", "-o", "%P|%G").split()]
    names = sorted({r[0].rstrip("*") for r in rows})  # the default partition's ends in *
    want, gpus = cluster.partition, cluster.gpus_per_node
    if want is not None and want not in names:
        raise ConfigError(f"cluster partition={want!r} is not one of this cluster's: {names}")
    part = (want or next((r[0] for r in rows if r[0].endswith("*")), "")).rstrip("*")
    gres = sorted({r[1] for r in rows if r[0].rstrip("*") == part})
    if gpus > max(map(_gpus, gres), default=0):
        raise ConfigError(
            f"cluster gpus_per_node={gpus}: no node of partition {part!r} has as many (sinfo's "
            f"GRES: {', '.join(gres)})"
        )


def _gpus(gres: str) -> int:
    """The GPUs of one of sinfo's GRES texts (``gpu:a100:4(S:0-1),shard:8``: 4; ``(null)``: 0)."""
    kinds = [g.split("(")[0].split(":") for g in gres.split(",")]
    return sum(int(k[-1]) if k[-1].isdigit() else 1 for k in kinds if k[0] == "gpu")


def _slurm(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(args)}: {(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


# -- on the allocation -------------------------------------------------------------------------


class TrainJob:
    """A run as a submitit callable (checkpointable: see the module), one per task."""

    def __init__(self, args: list[str], log: str, nproc_per_node: int, signal: str) -> None:
        self.args, self.log, self.nproc, self.signal = args, log, nproc_per_node, signal
        self.child: subprocess.Popen | None = None

    def command(self) -> list[str]:
        import submitit

        env = submitit.JobEnvironment()
        if env.num_tasks == 1 and self.nproc == 1:
            return [sys.executable, "-m", "lbsgd", "train", *self.args]
        port = 20_000 + int(str(env.job_id).split("_")[0]) % 20_000
        endpoint = f"{env.hostnames[0]}:{port}"
        head = launch.torchrun(
            self.nproc, nnodes=env.num_tasks, endpoint=endpoint, node_rank=env.global_rank
        )
        return [*head, "-m", "lbsgd", "train", *self.args]

    def __call__(self) -> int:
        """The run's attempt; an error (the job fails) unless the run is completed or diverged, or
        this attempt stopped it (interrupted: a signal)."""
        import submitit

        log, env, began = Path(self.log), submitit.JobEnvironment(), time.time()
        sig = f"SIG{self.signal}"
        run_dir = config.load([], self.args).run_dir()
        how = commands.how_it_starts(run_dir)
        with log.open("a") as out:
            if env.global_rank == 0:
                out.write(f"{commands.attempt_line(log, how)} (Slurm job {env.job_id})\n")
                out.flush()
            self.child = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,  # its group: torchrun's agent and workers
                # the signal ignored in the trainer's process before exec: torchrun's agent too
                preexec_fn=lambda: signals.signal(getattr(signals, sig), signals.SIG_IGN),
            )
            while running(self.child.pid):  # not Popen.wait(): the handler below must poll
                time.sleep(0.5)
        status = rundir.read_status(run_dir)
        stopped = status == "interrupted" and (run_dir / "summary.json").stat().st_mtime >= began
        if status not in ("completed", "diverged") and not stopped:
            raise RuntimeError(f"run failed (exit code {self.child.wait()}), its log: {log}")
        return self.child.wait()

    def checkpoint(self) -> Any:
        """submitit's hook on the pre-emption signal (rank 0): the signal to the trainer's
        processes, again every few seconds (one that came before the trainer took it over was
        ignored) until they have checkpointed and stopped; then a fresh copy of this job is
        requeued. torchrun's agent ignores the signal and ends with its workers."""
        import submitit

        sig = getattr(signals, f"SIG{self.signal}")
        while self.child is not None and running(self.child.pid):
            with contextlib.suppress(OSError):
                os.killpg(self.child.pid, sig)
            for _ in range(10):
                if not running(self.child.pid):
                    break
                time.sleep(0.5)
        return submitit.helpers.DelayedSubmission(
            TrainJob(self.args, self.log, self.nproc, self.signal)
        )


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux: an exited process not yet reaped, a zombie, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- on the submitting machine -----------------------------------------------------------------


class Queue:
    """The queue's states of this user's jobs (``squeue --me -t all``), read at most every
    ``poll_s``; ``say`` tells when the controller stops answering and when it answers again."""

    def __init__(self, poll_s: float, say=lambda line: None) -> None:
        self.poll_s, self.say, self.read_at, self.states, self.down = poll_s, say, -1e9, {}, False

    def state(self, job_id: str) -> tuple[str, str, str]:
        """(state, node, Slurm's reason) of ``job_id``: state :data:`GONE` once it left the
        queue."""
        if time.monotonic() - self.read_at >= self.poll_s:
            self.refresh()
        return self.states.get(job_id, (GONE, "", ""))

    def refresh(self) -> None:
        """Read the queue; where squeue fails (a busy controller times out), keep the last
        states and read again at the next look, rather than end the sweep or call jobs ended."""
        self.read_at = time.monotonic()
        try:
            out = _slurm("squeue", "--me", "-t", "all", "-h", "-o", "%i|%T|%N|%r")
        except ConfigError as e:
            if not self.down:
                self.say(f"[slurm] no answer from the controller, the jobs' last states stand: {e}")
            self.down = True
            return
        if self.down:
            self.say("[slurm] the controller answers again")
        rows = (line.split("|") for line in out.splitlines() if line.strip())
        self.states, self.down = {r[0]: (r[1], r[2], r[3]) for r in rows if len(r) == 4}, False


class SlurmProc:
    """A submitted job as :mod:`lbsgd.jobs` sees a process: its state from the queue."""

    def __init__(self, job_id: str, queue: Queue, last: tuple[str, str, str] = ("", "", "")):
        self.job_id, self.queue = job_id, queue
        queue.read_at = -1e9  # a snapshot older than the job would say it ended
        self.returncode: int | None = None
        self.last = last  # the last state said
        self.ended = ""  # the state it ended in (GONE: unknown, it left the queue unseen)

    def poll(self) -> int | None:
        state = self.queue.state(self.job_id)[0]
        if self.returncode is None and state in (GONE, *ENDED):
            self.ended, self.returncode = state, int(state != "COMPLETED")
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.2)
        return self.returncode


class SlurmLauncher:
    """``launcher="slurm"`` (a ``Launcher`` of :mod:`lbsgd.lab.experiments.sweeps`): each run a job
    submitted to ``cluster`` (or attached to), one line as its queue state changes, its end as
    Slurm gives it; SIGHUP (its client gone) leaves the jobs running, unwatched."""

    here = False  # the runs train on the allocation: this machine's devices are not theirs

    def __init__(self, cluster: Cluster, say, *, nproc_per_node: int, nnodes: int, **_) -> None:
        self.cluster, self.nnodes, self.nproc = cluster, nnodes, nproc_per_node
        self.world_size = nproc_per_node * nnodes * cluster.tasks_per_node
        self.queue = Queue(cluster.poll_s, say)

    cluster_of = staticmethod(cluster_of)

    def check(self, cfgs: list[Config]) -> None:
        """Slurm's commands on PATH, the partition (:func:`_partition`), and every run able to
        resume (a run without checkpoints cannot survive a time limit)."""
        for tool in ("sbatch", "squeue", "scancel", "sinfo"):
            if shutil.which(tool) is None:
                raise ConfigError(
                    f"launcher=slurm: {tool} is not on PATH (is this a Slurm login node?)"
                )
        _partition(self.cluster)
        for c in cfgs:
            if not c.checkpoint:
                raise ConfigError(
                    f"run {c.run_name()}: checkpoint=false cannot run under launcher=slurm (a job "
                    "stopped at its time limit or pre-empted resumes from its checkpoint)"
                )

    def start(self, run: SweepRun) -> SlurmProc:
        """The run's job: the one recorded for it while it is queued or running, else a new one."""
        path = job_dir(run.cfg) / "job_id"
        job_id = path.read_text().strip() if path.is_file() else ""
        if job_id and self.queue.state(job_id)[0] not in (GONE, *ENDED):
            run.how = f"attached to Slurm job {job_id}"
            return SlurmProc(job_id, self.queue)
        job_id = submit(
            run.cfg, train_args(run.cfg), run.log, self.cluster, self.nnodes, self.nproc
        )
        run.how = f"queued as Slurm job {job_id}"
        return SlurmProc(job_id, self.queue, last=("PENDING", "", "None"))  # said by that line

    def watch(self, job: SweepJob) -> str:
        p = job.proc
        now = state, node, reason = self.queue.state(p.job_id)
        if state in ("", "COMPLETING", *ENDED) or now == p.last:
            return ""
        if p.last[0] == "RUNNING" and state != "SUSPENDED":  # an attempt ended, the job stays
            text = f"requeued, {stop_text(job.item.cfg.run_dir())[0]}"
        elif state == "RUNNING":
            text = f"running on {node}"
        else:
            text = state.lower() + (f" ({reason})" if reason not in ("", "None") else "")
        p.last = now
        return f"{text} (Slurm job {p.job_id})"

    def stop(self, proc: SlurmProc) -> None:
        """SIGTERM to a running job's processes (each run checkpoints and stops); a queued job is
        removed from the queue."""
        queued = self.queue.state(proc.job_id)[0] == "PENDING"
        _quiet("scancel", *([] if queued else ["--signal=TERM"]), proc.job_id)
        self.queue.read_at = -1e9  # read the queue again at the next look

    def kill(self, proc: SlurmProc) -> None:
        _quiet("scancel", "--signal=KILL", proc.job_id)
        _quiet("scancel", proc.job_id)
        self.queue.read_at = -1e9

    def close(self, job: SweepJob) -> tuple[Path, str]:
        """The log that tells how the job went (the run's, or submitit's), and how it ended."""
        p, run = job.proc, job.item
        how = f"Slurm job {p.job_id} {p.ended or 'left the queue'}"
        return node_log(run.cfg, run.log, p.job_id), how

    def hang_up(self, study: str, runner, progress: Progress) -> RunInterrupted:
        """SIGHUP: every job left running, unwatched; a sweep started again attaches to them."""
        for job in runner.running:
            progress.line(job, f"left running as Slurm job {job.proc.job_id}")
        for job in runner.pending:
            progress.line(job, "not started")
        return RunInterrupted(
            f"sweep of study {study!r} detached (SIGHUP): {len(runner.running)} Slurm jobs "
            f"left running, {len(runner.pending)} runs not started; run the same sweep again to "
            "attach to them and go on",
            [j.item.cfg.run_name() for j in (*runner.running, *runner.pending)],
        )


def _quiet(*args: str) -> None:
    subprocess.run(args, capture_output=True, stdin=subprocess.DEVNULL)


def job_dir(cfg: Config) -> Path:
    """Where a run's Slurm files go (submitit's, its job id): the study's ``.slurm/<run>/``."""
    return Path(cfg.out_dir) / cfg.study / ".slurm" / cfg.run_name()


def job_name(cfg: Config) -> str:
    """A run's job name: its name and its folder's (so ``--dependency=singleton`` holds back a
    second job of the same run folder, not the same run of another ``out_dir``)."""
    where = hashlib.sha1(str(cfg.run_dir().resolve()).encode()).hexdigest()[:6]
    return f"{cfg.run_name()}-{where}"


def node_log(cfg: Config, log: Path, job_id: str) -> Path:
    """The log that tells how job ``job_id`` went: the run's, when the job's attempt began there,
    else submitit's (the node's Python could not start the run)."""
    if log.is_file() and f"(Slurm job {job_id})" in log.read_text(errors="replace"):
        return log
    return next(iter(sorted(job_dir(cfg).glob(f"{job_id}_*log.out"))), log)


def submit(
    cfg: Config, args: list[str], log: Path, cluster: Cluster, nnodes: int, nproc: int
) -> str:
    """Submit the run as one job (see the module); its id, also written under :func:`job_dir`."""
    import submitit
    from submitit.core import utils

    folder = job_dir(cfg)
    ex = submitit.SlurmExecutor(folder=folder, python=cluster.python)
    params = {
        "job_name": job_name(cfg),
        "time": cluster.time_min,
        "nodes": nnodes,
        "ntasks_per_node": cluster.tasks_per_node,
        "cpus_per_task": cluster.cpus_per_task,
        "stderr_to_stdout": True,
        "setup": [f"export SUBMITIT_PREEMPT_SIGNAL={cluster.signal}", *cluster.setup],
        # sbatch's --signal the cluster's, not submitit's (its SUBMITIT_PREEMPT_SIGNAL as read in
        # this process at import, USR2 when unset); the setup line above sets the node's
        "additional_parameters": {
            "dependency": "singleton",
            **cluster.sbatch,
            "signal": f"{cluster.signal}@{cluster.signal_delay_s}",
        },
    }
    keys = ("partition", "account", "qos", "constraint", "gpus_per_node")
    params.update({k: getattr(cluster, k) for k in keys if getattr(cluster, k)})  # 0 GPUs: none
    if cluster.mem_gb is not None:
        params["mem"] = f"{cluster.mem_gb:g}GB"
    ex.update_parameters(**params)
    try:
        job = ex.submit(TrainJob(args, str(log.resolve()), nproc, cluster.signal))
    except (utils.FailedSubmissionError, utils.FailedJobError) as e:  # what sbatch refuses
        why = " ".join(str(e).split())[:400]
        raise ConfigError(f"sbatch refused run {cfg.run_name()}: {why}") from None
    (folder / "job_id").write_text(f"{job.job_id}\n")
    return str(job.job_id)
