"""Slurm as a sweep's launcher (``launcher="slurm"``): each run one Slurm job, submitted with
submitit, the sweep's runner (:mod:`lbsgd.jobs`) keeping ``parallel`` in flight; docs/cluster.md
is the user's page. :class:`Cluster` is a checked cluster file, :class:`TrainJob` what runs on each
task (requeued only after the trainer checkpointed on the pre-emption signal), :class:`SlurmProc` a
job as the runner sees a process (state from ``squeue``; SIGTERM stops a running job, removes a
queued one). A run's job id under the study's ``.slurm/<run>/`` lets a sweep started again attach
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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from lbsgd import config, launch, rundir
from lbsgd.config import Config, ConfigError

CLUSTER_DIR = Path("configs") / "cluster"  # the cluster files' folder, under the repository
SIGNALS = ("USR1", "USR2")  # pre-emption signals the trainer stops on (lbsgd.cadence)
GONE = ""  # the state of a job no longer in the queue: it ended
# the states of a job that has ended for good (squeue -t all, for MinJobAge after its end); a
# pre-empted or failed node's job may be requeued, and a job that leaves the queue has ended too
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


@dataclass(frozen=True)
class Cluster:
    """Where and how a sweep's runs go as Slurm jobs: the allocation of each job (its nodes are the
    sweep's ``nnodes``, its processes per node ``nproc_per_node``), the pre-emption signal and its
    lead before the time limit, extra ``#SBATCH`` options, shell lines run before the trainer, the
    nodes' Python, and how often the queue is read."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_min: int = 60
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_gb: float | None = None
    tasks_per_node: int = 1  # torchrun agents a node: 1 on a cluster; 2 puts two "nodes" on one
    signal: str = "USR1"
    signal_delay_s: int = 120
    sbatch: dict[str, Any] = field(default_factory=dict)  # e.g. {exclusive: true, mail-type: END}
    setup: list[str] = field(default_factory=list)  # e.g. ["module load cuda/12.4"]
    python: str | None = None  # the nodes' interpreter (default: this one)
    poll_s: float = 5.0


_TYPES = {f.name: f.type for f in fields(Cluster)}


def cluster_of(spec: str | os.PathLike | None, root: Path | None = None) -> Cluster:
    """The cluster of ``spec``: ``"NAME [key=value ...]"`` (``NAME`` a file of
    ``root/configs/cluster/``, or a YAML path; values read as YAML). One line naming the key or
    file where anything is off."""
    words = str(spec or "").split()
    if not words:
        raise ConfigError("cluster=None: launcher=slurm needs a cluster file (docs/cluster.md)")
    keys = _read(words[0], root or Path.cwd())
    for w in words[1:]:
        key, sep, value = w.partition("=")
        if not sep:
            raise ConfigError(f"cluster override {w!r}: write key=value")
        keys[key] = yaml.safe_load(value)
    return _checked(keys, words[0])


def _read(name: str, root: Path) -> dict[str, Any]:
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = root / CLUSTER_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (root / CLUSTER_DIR).glob("*.yaml"))
        raise ConfigError(f"cluster={name!r}: no file {str(path)!r} (cluster files: {known})")
    keys = yaml.safe_load(path.read_text()) or {}
    if not isinstance(keys, dict):
        raise ConfigError(f"cluster file {str(path)!r} must hold key: value lines")
    return keys


def _checked(keys: dict[str, Any], name: str) -> Cluster:
    for k, v in keys.items():
        if k not in _TYPES:
            raise ConfigError(f"cluster {name!r}: unknown key {k!r} (keys: {sorted(_TYPES)})")
        if not _fits(v, _TYPES[k]):
            raise ConfigError(f"cluster {name!r}: {k}={v!r} must be {_TYPES[k]}")
    c = Cluster(**keys)
    if c.signal not in SIGNALS:
        raise ConfigError(f"cluster {name!r}: signal={c.signal!r} must be one of {SIGNALS}")
    if "signal" in c.sbatch:
        raise ConfigError(f"cluster {name!r}: sbatch's signal is the keys signal, signal_delay_s")
    for k in ("time_min", "cpus_per_task", "tasks_per_node", "signal_delay_s"):
        if getattr(c, k) < 1:
            raise ConfigError(f"cluster {name!r}: {k}={getattr(c, k)} must be at least 1")
    if c.time_min * 60 <= c.signal_delay_s + 60:
        raise ConfigError(
            f"cluster {name!r}: time_min={c.time_min} leaves no minute of training before the "
            f"pre-emption signal's lead (signal_delay_s={c.signal_delay_s}): a job would be "
            "signalled before its first checkpoint"
        )
    return c


def _fits(v: Any, kind: str) -> bool:
    want = {
        "str | None": (str, type(None)),
        "int": int,
        "float | None": (int, float, type(None)),
        "float": (int, float),
        "str": str,
        "dict[str, Any]": dict,
        "list[str]": list,
    }[kind]
    return isinstance(v, want) and not isinstance(v, bool)


def check(cluster: Cluster, cfgs: list[Config]) -> None:
    """Before any job is submitted: Slurm's commands on PATH, the partition (:func:`_partition`),
    and every run able to resume (a run without checkpoints cannot survive a time limit)."""
    for tool in ("sbatch", "squeue", "scancel", "sinfo"):
        if shutil.which(tool) is None:
            raise ConfigError(
                f"launcher=slurm: {tool} is not on PATH (is this a Slurm login node?)"
            )
    _partition(cluster)
    for c in cfgs:
        if not c.checkpoint:
            raise ConfigError(
                f"run {c.run_name()}: checkpoint=false cannot run under launcher=slurm (a job "
                "stopped at its time limit or pre-empted resumes from its checkpoint)"
            )


def _partition(cluster: Cluster) -> None:
    """The cluster's partition (default: the default one) known to ``sinfo``, with a node that
    holds ``gpus_per_node`` GPUs."""
    rows = [r.split("|") for r in _slurm("sinfo", "-h", "-o", "%P|%G").split()]
    names = sorted({r[0].rstrip("*") for r in rows})  # the default partition's ends in *
    if cluster.partition is not None and cluster.partition not in names:
        raise ConfigError(
            f"cluster partition={cluster.partition!r} is not one of this cluster's: {names}"
        )
    part = (cluster.partition or next((r[0] for r in rows if r[0].endswith("*")), "")).rstrip("*")
    _has_gpus(cluster.gpus_per_node, part, sorted({r[1] for r in rows if r[0].rstrip("*") == part}))


def _has_gpus(n: int, part: str, gres: list[str]) -> None:
    """One line when no node of partition ``part`` (sinfo's ``gres`` texts) holds ``n`` GPUs."""
    if n > max(map(_gpus, gres), default=0):
        raise ConfigError(
            f"cluster gpus_per_node={n}: no node of partition {part!r} has as many (sinfo's "
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


def _ignore(sig: int) -> None:  # in the trainer's process before exec: torchrun's agent keeps it
    signals.signal(sig, signals.SIG_IGN)


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

        from lbsgd.experiments import commands

        log, env, began = Path(self.log), submitit.JobEnvironment(), time.time()
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
                preexec_fn=lambda: _ignore(getattr(signals, f"SIG{self.signal}")),
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
    """A submitted job as :mod:`lbsgd.jobs` sees a process (see the module)."""

    pid = None

    def __init__(self, job_id: str, queue: Queue) -> None:
        self.job_id, self.queue = job_id, queue
        queue.read_at = -1e9  # a snapshot older than the job would say it ended
        self.returncode: int | None = None
        self.last = ("", "", "")  # the last state said
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

    def send_signal(self, sig: int) -> None:
        """SIGTERM to a running job's processes (each run checkpoints and stops); a queued job is
        removed from the queue."""
        state = self.queue.state(self.job_id)[0]
        if state == "PENDING":
            _quiet("scancel", self.job_id)
        else:
            _quiet(
                "scancel", f"--signal={signals.Signals(sig).name.removeprefix('SIG')}", self.job_id
            )
        self.queue.read_at = -1e9  # read the queue again at the next look

    def kill(self) -> None:
        _quiet("scancel", "--signal=KILL", self.job_id)
        _quiet("scancel", self.job_id)
        self.queue.read_at = -1e9


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


def recorded(cfg: Config, queue: Queue) -> str | None:
    """The job id recorded for the run when that job is still queued or running, else None."""
    path = job_dir(cfg) / "job_id"
    if not path.is_file():
        return None
    job_id = path.read_text().strip()
    return job_id if queue.state(job_id)[0] not in (GONE, *ENDED) else None


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
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(cluster, key) is not None:
            params[key] = getattr(cluster, key)
    if cluster.gpus_per_node:
        params["gpus_per_node"] = cluster.gpus_per_node
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
