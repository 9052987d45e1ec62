"""A real single-node Slurm cluster on localhost for tests (Debian's slurm-wlm and munge, as root):
munged, slurmctld and slurmd started in one folder on free ports, stopped by their PIDs."""

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from lbsgd.lab.experiments.slurm import running as alive  # a zombie counts as dead

SBIN = "/usr/sbin"
NEEDED = ("slurmctld", "slurmd", "munged", "sbatch")
DAEMONS = ("munged", "slurmctld", "slurmd")  # in start order; stopped in reverse
PARTITION = "debug"
# inherited from an enclosing Slurm job, these would send client commands to that job's cluster
FOREIGN = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCANCEL_")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=SBIN)


def available() -> str | None:
    """None where a cluster can start here, else one line saying why not."""
    missing = [n for n in NEEDED if _which(n) is None]
    if missing:
        return f"Slurm missing ({', '.join(missing)} not found): apt-get install slurm-wlm munge"
    return None if os.geteuid() == 0 else "a local Slurm cluster needs root (SlurmUser=root)"


def wait_until(done, seconds: float, step: float = 0.1) -> bool:
    """Polls ``done()`` until it is true (True) or ``seconds`` pass (False)."""
    end = time.monotonic() + seconds
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(step)
    return True


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalSlurm:
    """One node (``localhost``, every CPU) and one default partition; all files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder).resolve()
        self.conf = self.folder / "slurm.conf"
        self.partition = PARTITION
        self.pids: dict[str, int] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
        self.env["SLURM_CONF"] = str(self.conf)

    def run(self, *args: str, check: bool = True, timeout: float = 30):
        """A client command (``sbatch``, ``squeue``...) on this cluster: its CompletedProcess."""
        return subprocess.run(
            args, env=self.env, capture_output=True, text=True, check=check, timeout=timeout
        )

    def __enter__(self) -> "LocalSlurm":
        try:
            self._write()
            for name in DAEMONS:
                self._start(name)
            if not wait_until(self._idle, 30, 0.2):
                raise RuntimeError("node not idle within 30 s")
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            logs = self._logs()
            self._stop()
            raise RuntimeError(f"local Slurm did not start: {e}\n{logs}") from e
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._cancel_all()
        finally:
            self._stop()

    def _write(self) -> None:
        f = self.folder
        for sub in ("state", "spool"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        (f / "munge").mkdir(mode=0o755, exist_ok=True)  # munged wants its socket folder open
        key = f / "munge.key"
        key.unlink(missing_ok=True)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        cpus = os.cpu_count() or 1
        mem = _mem_total_mb() * 8 // 10
        ctld, slurmd = _free_ports(2)
        self.conf.write_text(
            f"""ClusterName=local
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={f}/munge/socket,cred_expire=5
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.pid
SlurmctldLogFile={f}/slurmctld.log
SlurmdLogFile={f}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={mem // cpus}
SchedulerParameters=sched_interval=1,bf_interval=1
KillWait=30
MinJobAge=30
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
JobRequeue=1
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} State=UNKNOWN
PartitionName={PARTITION} Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _command(self, name: str) -> list[str]:
        f, exe = self.folder, _which(name)
        if name == "munged":
            return [exe, f"--socket={f}/munge/socket", f"--key-file={f}/munge.key",
                    f"--pid-file={f}/munged.pid", f"--log-file={f}/munged.log",
                    f"--seed-file={f}/munged.seed", "--force"]  # fmt: skip
        return [exe, "-f", str(self.conf)] + (["-N", "localhost"] if name == "slurmd" else [])

    def _start(self, name: str) -> None:
        pidfile = self.folder / f"{name}.pid"
        pidfile.unlink(missing_ok=True)
        with open(self.folder / f"{name}.out", "w") as out:
            subprocess.run(
                self._command(name), env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, check=True, timeout=30,
            )  # fmt: skip
        if not wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10):
            raise RuntimeError(f"{name} wrote no PID file")
        self.pids[name] = int(pidfile.read_text())

    def _logs(self, lines: int = 15) -> str:
        """The last ``lines`` of each daemon's log and output, for a failed start."""
        paths = [self.folder / f"{n}.{ext}" for n in DAEMONS for ext in ("out", "log")]
        tails = [(p.name, p.read_text(errors="replace").splitlines()) for p in paths if p.exists()]
        return "\n".join(f"--- {name}\n" + "\n".join(text[-lines:]) for name, text in tails if text)

    def _idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False).stdout
        return out.strip() == "idle"

    def _jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def _cancel_all(self) -> None:
        jobs = self._jobs() if "slurmctld" in self.pids else []
        if jobs:
            self.run("scancel", "--full", *jobs, check=False)
            if not wait_until(lambda: not self._jobs(), 15, 0.5):  # a job deaf to SIGTERM
                self.run("scancel", "--full", "--signal=KILL", *jobs, check=False)
                wait_until(lambda: not self._jobs(), 10, 0.5)

    def _stop(self) -> None:
        for name in reversed(DAEMONS):
            pid = self.pids.get(name)
            if pid is None or not alive(pid):
                continue
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not wait_until(lambda p=pid: not alive(p), 10):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_until(lambda p=pid: not alive(p), 5)


def _mem_total_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")
