"""``lbsgd bench allreduce``: all-reduce time and bus bandwidth against message size, fitted.

Each process of a local torchrun (static rendezvous) runs :func:`worker`: per message size and path
(``flat``, or lbsgd.comm's ``hierarchical``) the median of ``iters`` barrier-bracketed all-reduces,
the slowest rank's counting. Rank 0 writes the table, the bus bandwidth (NCCL-tests' convention)
and the α–β fits of lbsgd.costmodel. ``lbsgd bench train --nproc LIST``: where a data-parallel
step's time goes (:func:`bench_breakdown`)."""

from __future__ import annotations

import gc
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lbsgd import comm, config, costmodel, data, distributed, models, optim
from lbsgd.bench.torchrun import torchrun
from lbsgd.bench.train import DEFAULTS, write
from lbsgd.environment import environment
from lbsgd.network import memory_format


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 from ``min_bytes`` up to ``max_bytes`` (both rounded to whole fp32 values)."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise config.ConfigError(f"need 4 <= min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
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
        distributed.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    distributed.all_reduce_max(t)
    return float(t.item())


def _fits(rows: list[dict], world: int) -> dict[str, dict]:
    """The cost model fitted to each path's timings (its error where no bandwidth fits)."""
    fits = {}
    models = {
        "flat_ring": (
            "t = 2(p-1)*alpha + 2(p-1)/p * n/beta",
            "flat",
            lambda x, y: costmodel.fit_ring_allreduce(x, y, world),
        ),
        "hierarchical_effective": ("t = alpha + n/beta", "hierarchical", costmodel.fit_alpha_beta),
    }
    for key, (model, path, fit) in models.items():
        sel = [r for r in rows if r["path"] == path]
        try:
            link = fit([r["bytes"] for r in sel], [r["seconds"] for r in sel])
            alpha, bandwidth, error = link.alpha_s, link.bandwidth_Bps, {}
        except ValueError as e:  # e.g. sizes too small for the time to grow with them
            alpha, bandwidth, error = None, None, {"error": str(e)}
        fits[key] = {"alpha_s": alpha, "bandwidth_Bps": bandwidth, "model": model, **error}
    return fits


def worker(out: str, min_bytes: int, max_bytes: int, iters: int) -> None:
    """One process of :func:`bench_allreduce`: the flat and the hierarchical all-reduce timed at
    every size; rank 0 prints each and writes the result."""
    ctx = distributed.init("cpu")  # gloo
    rank, world, local_world = ctx.rank, ctx.world_size, ctx.local_world_size
    groups = comm.Groups(comm.Topology.of(world, local_world))
    rows = []
    for n in sizes(min_bytes, max_bytes):
        t = torch.ones(n // 4)
        paths = {
            "flat": distributed.all_reduce_sum,
            "hierarchical": lambda t: comm.hierarchical_all_reduce(t, groups),
        }
        for path, fn in paths.items():
            s = _time(lambda fn=fn, t=t: fn(t), iters)
            bus = comm.bus_bandwidth(n, s, world)
            rows.append({"path": path, "bytes": n, "seconds": s, "bus_bandwidth_Bps": bus})
            if rank == 0:
                print(
                    f"{path:>12} {n:>11,d} B  {s * 1e3:9.3f} ms  {bus / 1e9:7.3f} GB/s bus",
                    flush=True,
                )
    if rank == 0:
        fits = _fits(rows, world)
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
        write(result, out)
        print(f"fits: {json.dumps(fits)}\nwrote {out}", flush=True)
    distributed.shutdown()


def bench_allreduce(
    nproc: int, nodes: int, min_bytes: int, max_bytes: int, iters: int, out: str
) -> None:
    """Start ``nodes`` torchrun agents on this machine and run :func:`worker` in each process;
    bad sizes or process counts are a one-line ConfigError, before anything starts."""
    if nproc < 2 or nodes < 1 or nproc % nodes:
        raise config.ConfigError(f"--nproc={nproc} must be >= 2 and a multiple of --nodes={nodes}")
    sizes(min_bytes, max_bytes)  # bad sizes fail here, before anything starts
    args = ["bench", "allreduce", "--worker", f"--iters={iters}", f"--out={out}"]
    args += [f"--min-bytes={min_bytes}", f"--max-bytes={max_bytes}"]
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
    ctx = distributed.init("cpu")
    try:
        row = _measure(ctx, overrides, steps)
        gc.collect()  # whatever of the model a reference cycle kept, while the group is alive
        if row is not None:
            Path(out).write_text(json.dumps(row) + "\n")
    finally:
        distributed.shutdown()


def _phase_times(model, opt, tensors, mb: int, fmt, g: torch.Generator, steps: int) -> dict:
    """Each phase's seconds (data, forward, backward with its communication, optimizer) at each
    of ``steps`` steps, after 3 untimed ones, every step starting together on every rank."""
    x_all, y_all = tensors
    times: dict[str, list[float]] = {k: [] for k in PHASES}
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
    return times


def _measure(ctx, overrides: list[str], steps: int) -> dict | None:
    """:func:`step_worker`'s measurement: rank 0's row (the slowest rank's medians), else None."""
    cfg = config.from_dict({**DEFAULTS, **config.parse_overrides(overrides)})
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    splits = data.build(cfg, ctx.device)  # the gloo breakdown runs on the host
    mb = config.micro_batch(cfg)  # weak scaling: each process keeps its micro-batch
    cfg = cfg.replace(batch_size=mb * ctx.world_size, micro_batch=mb)
    config.check_world(cfg, ctx.world_size, ctx.local_world_size)
    torch.manual_seed(cfg.seed)
    net = models.build(cfg, splits.num_classes, splits.image_size)
    fmt = memory_format(cfg)
    net.to(memory_format=fmt).train()
    opt = optim.build(cfg, net)
    model = distributed.wrap(net, ctx, cfg.bucket_cap_mb, cfg.comm_hook, cfg.powersgd_rank, 0)
    grad_bytes = sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
    g = torch.Generator().manual_seed(cfg.seed + ctx.rank)
    times = _phase_times(model, opt, splits.train.tensors, mb, fmt, g, steps)
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


def _layouts(
    nprocs: list[int], hooks: list[str], bucket_caps: list[float]
) -> list[tuple[int, str, float]]:
    """The (processes, comm_hook, bucket_cap_mb) layouts: 1 process once (its baseline), then every
    combination; one line for a bad process count or hook."""
    for n in nprocs:
        if n < 1:
            raise config.ConfigError(f"--nproc={n}: every layout needs at least 1 process")
    for h in hooks:
        if h not in comm.HOOKS:
            raise config.ConfigError(f"--comm-hooks: {h!r} is not one of {', '.join(comm.HOOKS)}")
    layouts = [(1, "none", bucket_caps[0])] if 1 in nprocs else []
    return layouts + [(n, h, b) for n in nprocs if n > 1 for h in hooks for b in bucket_caps]


def bench_breakdown(
    overrides: list[str],
    nprocs: list[int],
    hooks: list[str],
    bucket_caps: list[float],
    steps: int,
    out: str | None,
) -> dict:
    """Every (processes, comm_hook, bucket_cap_mb) layout, each under its own torchrun
    (hierarchical: 2 nodes of n/2 processes).

    Weak scaling, as in Goyal et al. and Jia et al.: every process keeps the micro-batch
    (``micro_batch``, else ``bn_batch``), so the global batch is processes × micro-batch; the
    ratio of each layout's throughput to 1 process is printed beside it (ideal: the process count
    while there are cores for every process).
    """
    cfg = config.from_dict({**DEFAULTS, **config.parse_overrides(overrides)})  # refuse bad keys
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (n, hook, cap) in enumerate(_layouts(nprocs, hooks, bucket_caps)):
            path = f"{tmp}/{i}.json"
            args = ["bench", "train", "--step-worker", f"--steps={steps}", f"--out={path}"]
            args += [*overrides, f"comm_hook={hook}", f"bucket_cap_mb={cap}"]
            nodes = 2 if hook == "hierarchical" and n % 2 == 0 else 1  # 2 nodes of n/2 processes
            what = f"lbsgd bench train: layout {n} x {hook} x {cap:g} MB failed"
            torchrun(nodes, n // nodes, args, what=what)
            rows.append(json.loads(Path(path).read_text()))
            r = rows[-1]
            print(
                f"{n} proc  {hook:>16}  bucket {cap:>6g} MB | data {r['data'] * 1e3:7.2f}  fwd "
                f"{r['forward'] * 1e3:7.2f}  bwd+comm {r['backward'] * 1e3:7.2f}  opt "
                f"{r['optimizer'] * 1e3:6.2f} ms | {r['img_per_s']:8.1f} img/s, "
                f"x{r['img_per_s'] / rows[0]['img_per_s']:.2f} vs 1 process",
                flush=True,
            )
    result = {
        "benchmark": "data-parallel step breakdown (gloo, CPU)",
        "steps": steps,
        "config": cfg.to_dict(),
        "rows": rows,
        "environment": {**environment(torch.device("cpu"), 1), "machine": platform.node()},
    }
    write(result, out)
    return result
