"""``lbsgd bench allreduce``: all-reduce time and bus bandwidth against message size, fitted.

Launched on its own, the command starts torchrun (``nodes`` agents on this machine with
``nproc / nodes`` processes each, static rendezvous on 127.0.0.1) and each process runs
:func:`worker`. For every message size (powers of 4 from ``min_bytes`` to ``max_bytes``, fp32) and
every path — ``flat`` (one all-reduce over the world) and ``hierarchical`` (lbsgd.comm's two-level
reduce / leaders' all-reduce / broadcast) — it times ``iters`` all-reduces after two warm-up
calls, each bracketed by barriers, and keeps the median; the slowest rank's median counts. Rank 0
writes the table, the bus bandwidth (NCCL-tests' convention: algorithm bandwidth × 2(p−1)/p) and
the α–β fits (lbsgd.scaling: the flat path fitted as a ring all-reduce, t = 2(p−1)α +
2(p−1)/p·n/β; the hierarchical path as one effective message, t = α + n/β).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lbsgd import comm, scaling
from lbsgd.environment import environment


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 from ``min_bytes`` up to ``max_bytes`` (both rounded to whole fp32 values)."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise ValueError(f"need 4 <= min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n // 4 * 4)
        n *= 4
    return out


def _time(fn, iters: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def worker(out: str, min_bytes: int, max_bytes: int, iters: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    groups = comm.Groups(comm.Topology.of(world, local_world))

    rows = []
    for n in sizes(min_bytes, max_bytes):
        t = torch.ones(n // 4)
        paths = {
            "flat": dist.all_reduce,
            "hierarchical": lambda t: comm.hierarchical_all_reduce(t, groups),
        }
        for path, fn in paths.items():
            s = _time(lambda fn=fn, t=t: fn(t), iters)
            rows.append(
                {
                    "path": path,
                    "bytes": n,
                    "seconds": s,
                    "bus_bandwidth_Bps": comm.bus_bandwidth(n, s, world),
                }
            )
            if rank == 0:
                print(
                    f"{path:>12} {n:>11,d} B  {s * 1e3:9.3f} ms  "
                    f"{rows[-1]['bus_bandwidth_Bps'] / 1e9:7.3f} GB/s bus",
                    flush=True,
                )
    if rank == 0:
        fits = {}
        models = {
            "flat_ring": (
                "t = 2(p-1)*alpha + 2(p-1)/p * n/beta",
                "flat",
                lambda x, y: scaling.fit_ring_allreduce(x, y, world),
            ),
            "hierarchical_effective": (
                "t = alpha + n/beta",
                "hierarchical",
                scaling.fit_alpha_beta,
            ),
        }
        for key, (model, path, fit) in models.items():
            sel = [r for r in rows if r["path"] == path]
            try:
                link = fit([r["bytes"] for r in sel], [r["seconds"] for r in sel])
                fits[key] = {
                    "alpha_s": link.alpha_s,
                    "bandwidth_Bps": link.bandwidth_Bps,
                    "model": model,
                }
            except ValueError as e:  # e.g. sizes too small for the time to grow with them
                fits[key] = {
                    "alpha_s": None,
                    "bandwidth_Bps": None,
                    "model": model,
                    "error": str(e),
                }
        result = {
            "benchmark": "allreduce",
            "backend": "gloo",
            "world_size": world,
            "nodes": world // local_world,
            "processes_per_node": local_world,
            "iters": iters,
            "rows": rows,
            "fits": fits,
            "environment": {**environment(torch.device("cpu"), world), "machine": platform.node()},
        }
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(out)
        print(f"fits: {json.dumps(fits)}\nwrote {out}", flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How long the other workers may take to exit once one has exited or an agent has stopped: then
# the ones still running are taken to hang, and are stopped and reported.
EXIT_GRACE_S = 60.0
_STATUS_DIR = "LBSGD_WORKER_STATUS_DIR"
# What each worker runs (torchrun --no-python): run_worker, with Python's stacks on a crash and on
# SIGUSR1 (the launcher's question to a worker that hangs), written to its stderr.
_WORKER = (
    "import faulthandler, signal, sys; faulthandler.enable(); "
    "faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "from lbsgd.bench_comm import run_worker; run_worker(sys.argv[1:])"
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
    from lbsgd.cli import main

    where = Path(os.environ[_STATUS_DIR]) / f"rank{os.environ['RANK']}"
    where.with_suffix(".pid").write_text(str(os.getpid()))
    code: int = 1
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        raise
    finally:
        where.with_suffix(".exit").write_text(str(code))
    sys.exit(code)


def torchrun(
    nodes: int, per_node: int, args: list[str], what: str = "lbsgd", grace_s: float = EXIT_GRACE_S
) -> None:
    """Run ``lbsgd <args>`` (:func:`run_worker`) on ``nodes`` torchrun agents of ``per_node``
    processes on this machine (static rendezvous on 127.0.0.1: node ranks 0 …).

    Never hangs on a worker that died: torchrun stops the group when a worker fails, but not when
    one exits 0 while another still waits (a deadlock, or a peer gone). So once any worker or agent
    has exited, the rest get ``grace_s`` seconds; then the ones still running dump their Python
    stacks and are killed. On any failure each failed rank's exit code (or "still running") and
    last stderr lines go to stderr, and SystemExit carries one line, prefixed ``what``.
    """
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="lbsgd-torchrun-") as tmp:
        status, logs = Path(tmp) / "status", Path(tmp) / "logs"
        status.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1", _STATUS_DIR: str(status)}
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nodes}",
            f"--nproc-per-node={per_node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "--tee=2",
        ]
        worker = ["--no-python", sys.executable, "-u", "-c", _WORKER, *args]
        agents, tails = [], []
        try:
            for i in range(nodes):
                agents.append(
                    subprocess.Popen(
                        [*launcher, f"--node-rank={i}", f"--log-dir={logs / str(i)}", *worker],
                        env=env,
                        stderr=subprocess.PIPE,
                        text=True,
                        errors="replace",
                    )
                )
                tails.append(_forward(agents[-1].stderr))
            hung = _wait(agents, status, grace_s)
        finally:
            for a in agents:  # nothing is left behind, on any exit (Ctrl-C included)
                if a.poll() is None:
                    _kill_workers(status)
                    a.kill()
                a.wait()
            for t in tails:
                t.join(timeout=5)
        codes = [a.returncode for a in agents]
        if hung is None and not any(codes):
            return
        report = _report(
            status,
            logs,
            per_node,
            nodes * per_node,
            hung or {},
            codes,
            "".join(line for t in tails for line in t.lines),
            grace_s,
        )
    raise SystemExit(f"{what}: {report}")


class _Forward(threading.Thread):
    """Copies an agent's stderr to ours line by line (a notebook shows it too), keeping the last
    lines: torchrun's summary of a failed worker."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream, self.lines = stream, collections.deque(maxlen=400)

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()


def _forward(stream) -> _Forward:
    t = _Forward(stream)
    t.start()
    return t


def _wait(agents: list, status: Path, grace_s: float) -> dict[int, int] | None:
    """Wait for every agent. None when they all exited in time; else, ``grace_s`` after the first
    worker or agent exited, the ranks still running (rank: pid), their stacks dumped to their
    stderr, and every worker killed."""
    first_exit = None
    while any(a.poll() is None for a in agents):
        if first_exit is None and (
            any(status.glob("*.exit")) or any(a.poll() is not None for a in agents)
        ):
            first_exit = time.monotonic()
        if first_exit is not None and time.monotonic() - first_exit > grace_s:
            running = {r: pid for r, pid in _pids(status).items() if _alive(pid)}
            for pid in running.values():
                _signal(pid, signal.SIGUSR1)  # faulthandler: its stacks to its stderr log
            time.sleep(2)
            _kill_workers(status)
            return running
        time.sleep(0.2)
    return None


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


def _stderr_tail(logs: Path, rank: int, per_node: int, n: int = 15) -> list[str]:
    """The last ``n`` non-empty lines the worker of ``rank`` wrote to stderr (torchrun's log)."""
    node, local = divmod(rank, per_node)
    files = sorted(logs.glob(f"{node}/*/attempt_*/{local}/stderr.log"))
    if not files:
        return []
    lines = files[-1].read_text(errors="replace").splitlines()
    noise = ("Extension modules:", "(total: ")  # faulthandler's list of loaded modules
    return [line for line in lines if line.strip() and not line.startswith(noise)][-n:]


def _report(
    status: Path,
    logs: Path,
    per_node: int,
    world: int,
    hung: dict[int, int],
    codes: list[int],
    agent_err: str,
    grace_s: float,
) -> str:
    """Each failed rank's state (exit code, or still running) and last stderr lines, to stderr;
    back, one line: the first failure (a crash, else the first rank to exit non-zero, else
    torchrun's root cause, else a rank that hung) with its telling stderr line, then every other
    rank's state."""
    exits, exited_at = {}, {}
    for f in status.glob("rank*.exit"):
        with contextlib.suppress(ValueError, OSError):
            exits[int(f.stem[4:])] = int(f.read_text())
            exited_at[int(f.stem[4:])] = f.stat().st_mtime
    for rank, code in _FAILURE.findall(agent_err):  # killed by a signal: no .exit file of its own
        exits.setdefault(int(rank), int(code))
    started = _pids(status)
    states = {}
    for rank in range(world):
        if rank in hung:
            states[rank] = f"still running {grace_s:g} s after a worker exited (killed)"
        elif rank in exits:
            code = exits[rank]
            sig = f" ({signal.Signals(-code).name})" if -code in _SIGNALS else ""
            states[rank] = f"exited with {code}{sig}"
        elif rank in started:
            states[rank] = "ended without an exit status"
        else:
            states[rank] = "never started"
    if not started and not exits:
        return f"torchrun exited with {codes} before any worker started (its output is above)"
    failed = [r for r in range(world) if states[r] != "exited with 0"]
    tails = {r: _stderr_tail(logs, r, per_node, 25 if r in hung else 15) for r in failed}
    for rank in failed:
        print(f"--- rank {rank}: {states[rank]}; last stderr lines:", file=sys.stderr)
        for line in tails[rank] or ["(none)"]:
            print(f"  {line}", file=sys.stderr)
    sys.stderr.flush()
    if not failed:  # every worker exited 0, but an agent failed or did not exit
        parts = ", ".join(f"rank {r} {states[r]}" for r in range(world))
        return f"{parts}; torchrun agents exited with {codes}"
    roots = {int(r) for r in _ROOT_CAUSE.findall(agent_err)}

    def cause(r: int) -> tuple:  # a crash, an error exit (the first), torchrun's root cause, a hang
        crash = exits.get(r, 0) < 0 and -exits[r] not in _STOPS
        error = r in exited_at and exits[r] != 0
        rank = 0 if crash else 1 if error else 2 if r in roots else 3 if r in hung else 4
        return rank, exited_at.get(r, 0.0), r

    first = min(failed, key=cause)
    line = _telling(tails[first], first in hung)
    others = [f"rank {r} {states[r]}" for r in range(world) if r != first]
    return f"rank {first} {states[first]}{': ' + line if line else ''}" + (
        f"; {', '.join(others)}" if others else ""
    )


def _telling(tail: list[str], hung: bool) -> str:
    """The line of a failed worker's stderr that says most: faulthandler's fatal error and the
    innermost frame, a hung worker's innermost frame, else the last line."""
    starts = [i for i, t in enumerate(tail) if t.startswith("Current thread")]
    frame = tail[starts[-1] + 1].strip() if starts and starts[-1] + 1 < len(tail) else ""
    fatal = [t for t in tail if t.startswith("Fatal Python error")]
    if fatal:
        return fatal[-1].strip() + (f", at {frame}" if frame else "")
    if hung and frame:
        return f"at {frame}"
    return tail[-1].strip() if tail else ""


def bench_allreduce(
    nproc: int, nodes: int, min_bytes: int, max_bytes: int, iters: int, out: str
) -> None:
    """Start ``nodes`` torchrun agents on this machine and run :func:`worker` in each process."""
    if nproc < 2 or nodes < 1 or nproc % nodes:
        raise ValueError(f"--nproc={nproc} must be >= 2 and a multiple of --nodes={nodes}")
    sizes(min_bytes, max_bytes)  # bad sizes fail here, before anything starts
    args = [
        "bench",
        "allreduce",
        "--worker",
        f"--min-bytes={min_bytes}",
        f"--max-bytes={max_bytes}",
        f"--iters={iters}",
        f"--out={out}",
    ]
    torchrun(nodes, nproc // nodes, args, what="lbsgd bench allreduce")


# ``lbsgd bench train --nproc 1,2,4``: where a data-parallel step's time goes, per layout and knob.
PHASES = ("data", "forward", "backward", "optimizer")


def step_worker(overrides: list[str], steps: int, out: str) -> None:
    """One process of a breakdown measurement: time each phase of ``steps`` optimizer steps.

    Phases: data (index the in-memory batch), forward (+ loss), backward (DDP's bucketed
    all-reduces overlap it and its end waits for them: backward with communication), optimizer
    (step + zero_grad). One micro-batch per step; the median over steps, the slowest rank's.

    The DDP model lives in :func:`_measure` only, so that it is gone before the process group is
    destroyed. Its reducer holds a reference to the group, and a reducer is freed with the GIL
    held: were it the group's last holder, freeing it would join gloo's worker threads while one
    of them waits for the GIL to drop a tensor of the last all-reduce (torch 2.11 does), a
    deadlock that leaves this rank hanging after the others have exited 0.
    """
    from lbsgd import distributed

    ctx = distributed.init("cpu")
    try:
        row = _measure(ctx, overrides, steps)
        gc.collect()  # whatever of the model a reference cycle kept, while the group is alive
        if row is not None:
            Path(out).write_text(json.dumps(row) + "\n")
    finally:
        distributed.shutdown()


def _measure(ctx, overrides: list[str], steps: int) -> dict | None:
    """:func:`step_worker`'s measurement: rank 0's row (the slowest rank's medians), else None."""
    from lbsgd import config, data, distributed, models, optim
    from lbsgd.bench import DEFAULTS

    cfg = config.from_dict({**DEFAULTS, **config.parse_overrides(overrides)})
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    splits = data.build(cfg, ctx.device)  # the gloo breakdown runs on the host
    mb = config.micro_batch(cfg)  # weak scaling: each process keeps its micro-batch
    cfg = cfg.replace(batch_size=mb * ctx.world_size, micro_batch=mb)
    config.check_world(cfg, ctx.world_size, ctx.local_world_size)
    torch.manual_seed(cfg.seed)
    net = models.build(cfg, splits.num_classes, splits.image_size)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    net.to(memory_format=fmt).train()
    opt = optim.build(cfg, net)
    model = distributed.wrap(net, ctx, cfg.bucket_cap_mb, cfg.comm_hook, cfg.powersgd_rank, 0)
    grad_bytes = sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
    x_all, y_all = splits.train.tensors
    g = torch.Generator().manual_seed(cfg.seed + ctx.rank)
    times = {k: [] for k in PHASES}
    warm = 3
    for i in range(warm + steps):
        distributed.barrier()
        t0 = time.perf_counter()
        idx = torch.randint(0, len(y_all), (mb,), generator=g)
        x, y = x_all[idx].contiguous(memory_format=fmt), y_all[idx]
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if i >= warm:
            for k, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[k].append(v)
    med = torch.tensor([statistics.median(times[k]) for k in PHASES], dtype=torch.float64)
    distributed.all_reduce_max(med)
    if not ctx.is_main:
        return None
    row = dict(zip(PHASES, (float(v) for v in med), strict=True))
    row["step"] = sum(row[k] for k in PHASES)
    row.update(
        nproc=ctx.world_size,
        micro_batch=mb,
        batch_size=cfg.batch_size,
        comm_hook=cfg.comm_hook,
        bucket_cap_mb=cfg.bucket_cap_mb,
        grad_bytes=grad_bytes,
        img_per_s=cfg.batch_size / row["step"],
    )
    return row


def bench_breakdown(
    overrides: list[str],
    nprocs: list[int],
    hooks: list[str],
    bucket_caps: list[float],
    steps: int,
    out: str | None,
) -> dict:
    """Every (processes, comm_hook, bucket_cap_mb) layout, each under its own torchrun.

    Weak scaling, as in Goyal et al. and Jia et al.: every process keeps the micro-batch
    (``micro_batch``, else ``bn_batch``), so the global batch is processes × micro-batch; the
    ratio of each layout's throughput to 1 process is printed beside it (ideal: the process count
    while there are cores for every process).
    """
    from lbsgd import config
    from lbsgd.bench import DEFAULTS

    cfg = config.from_dict({**DEFAULTS, **config.parse_overrides(overrides)})  # refuse bad keys
    for n in nprocs:
        if n < 1:
            raise ValueError(f"--nproc={n}: every layout needs at least 1 process")
    for h in hooks:
        if h not in comm.HOOKS:
            raise ValueError(f"--comm-hooks: {h!r} is not one of {', '.join(comm.HOOKS)}")
    layouts = [(1, "none", bucket_caps[0])] if 1 in nprocs else []
    layouts += [(n, h, b) for n in nprocs if n > 1 for h in hooks for b in bucket_caps]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (n, hook, cap) in enumerate(layouts):
            path = f"{tmp}/{i}.json"
            args = [
                "bench",
                "train",
                "--step-worker",
                f"--steps={steps}",
                f"--out={path}",
                *overrides,
                f"comm_hook={hook}",
                f"bucket_cap_mb={cap}",
            ]
            nodes = 2 if hook == "hierarchical" and n % 2 == 0 else 1  # 2 nodes of n/2 processes
            torchrun(
                nodes,
                n // nodes,
                args,
                what=f"lbsgd bench train: layout {n} x {hook} x {cap:g} MB failed",
            )
            rows.append(json.loads(Path(path).read_text()))
            base = rows[0]["img_per_s"]
            r = rows[-1]
            print(
                f"{n} proc  {hook:>16}  bucket {cap:>6g} MB | data {r['data'] * 1e3:7.2f}  fwd "
                f"{r['forward'] * 1e3:7.2f}  bwd+comm {r['backward'] * 1e3:7.2f}  opt "
                f"{r['optimizer'] * 1e3:6.2f} ms | {r['img_per_s']:8.1f} img/s, "
                f"x{r['img_per_s'] / base:.2f} vs 1 process",
                flush=True,
            )
    result = {
        "benchmark": "data-parallel step breakdown (gloo, CPU)",
        "steps": steps,
        "config": cfg.to_dict(),
        "rows": rows,
        "environment": {**environment(torch.device("cpu"), 1), "machine": platform.node()},
    }
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result
