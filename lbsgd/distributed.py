"""Everything that touches torch.distributed (with lbsgd.comm, its hooks; nothing else in lbsgd).

World size 1 is the normal case: without torchrun's environment the process is rank 0 of 1 and the
collectives below are identities. Under ``torchrun`` (or ``srun torchrun``) the process group is
gloo on CPU and NCCL on CUDA, initialised from torchrun's environment (``env://``).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Imported before any process group exists: this module binds ``group.WORLD`` as the default
# argument of its functions when first imported, and DDP's constructor imports it (through
# torch._dynamo). Imported once the group exists, it keeps the group for good:
# destroy_process_group cannot free it, gloo's threads outlive the interpreter, and a rank aborts
# at exit ("terminate called without an active exception") when such a thread frees the tensors
# of the run's last collective during finalisation. Imported here, its defaults are None.
import torch.distributed.nn.functional
from torch.nn.parallel import DistributedDataParallel

from lbsgd import comm
from lbsgd.config import ConfigError


@dataclass(frozen=True)
class Context:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def resolve(device: str = "auto", backend: str = "auto") -> tuple[str, str]:
    """(device type, process-group backend) that ``device`` and ``backend`` mean on this machine."""
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    kind = "cuda" if use_cuda else "cpu"
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    return kind, backend


def check_layout(device: str, backend: str, local_world_size: int) -> None:
    """One line (ConfigError) for a process layout this machine cannot run, before any work:
    CUDA asked for and absent, NCCL without GPUs, more processes per node than GPUs (NCCL needs
    a GPU per process; gloo lets processes share one)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no CUDA device (valid here: auto, cpu)")
    kind, backend = resolve(device, backend)
    if backend != "nccl":
        return
    if device == "cpu":
        raise ConfigError(
            "backend=nccl needs GPUs, not device=cpu (valid with device=cpu: auto, gloo)"
        )
    if kind != "cuda":
        raise ConfigError(
            "backend=nccl needs CUDA devices and torch sees none (valid here: auto, gloo)"
        )
    gpus = torch.cuda.device_count()
    if local_world_size > gpus:
        raise ConfigError(
            f"device={device}: {local_world_size} processes per node but {gpus} visible GPU(s): "
            f"NCCL needs one GPU per process (valid: --nproc-per-node <= {gpus}, or backend=gloo "
            "to share GPUs, or device=cpu)"
        )


def init(device: str = "auto", timeout_s: float = 600.0, backend: str = "auto") -> Context:
    """Join torchrun's process group when launched by it; otherwise a world of one."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    check_layout(device, backend, local_world_size)
    kind, backend = resolve(device, backend)
    if kind == "cuda":  # processes beyond the GPU count share them round-robin (gloo only)
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if "RANK" in os.environ and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend=backend,
            timeout=timeout,
            device_id=dev if backend == "nccl" else None,
            **_attempt_store(rank, world_size, timeout),
        )
    return Context(rank, world_size, local_rank, local_world_size, dev)


def _attempt_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dict[str, Any]:
    """After ``torchrun --max-restarts`` restarts a group, its workers meet in the agent's store,
    which outlives the failed attempt and still holds that attempt's keys (the peers' old
    addresses: the new group would try to connect to dead processes). Each attempt therefore gets
    its own key prefix. Without torchrun's agent store, init_process_group's own env:// is used."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"/lbsgd/attempt_{attempt}", store)
    return {"store": prefixed, "rank": rank, "world_size": world_size}


def backend_name(device: torch.device, backend: str = "auto") -> str:
    """The process group's backend, or the one a group would use (a world of one has none)."""
    if dist.is_initialized():
        return str(dist.get_backend())
    return resolve(device.type, backend)[1]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (before a clock is read); nothing to wait for on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def shutdown() -> None:
    """Destroy the process group, after the DDP models that use it: a DDP reducer released after
    the group holds the group's last reference, and on torch 2.11 freeing it then deadlocks gloo
    (one rank hangs at exit). The caller drops its models first; the collection here frees those
    kept alive only by reference cycles."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def _active() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if _active():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place; returns ``t``."""
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean over ranks, in place; returns ``t``."""
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Maximum over ranks, in place; returns ``t``."""
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s Python object on every rank (e.g. a go/no-go decision made by rank 0)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def on_main(ctx: Context, fn: Callable[[], Any], then_all: bool = False) -> Any:
    """Run ``fn`` on rank 0 and give every rank its result, or raise its error on every rank (the
    other ranks: a ConfigError carrying its message, so that no rank waits for a dead one).

    With ``then_all`` the other ranks run ``fn`` themselves once rank 0 has succeeded (rank 0 fills
    a cache first, the others read it).
    """
    result, error = None, None
    if ctx.is_main:
        try:
            result = fn()
        except Exception as e:  # re-raised below, after telling the other ranks
            error = e
    message = broadcast_object(None if error is None else str(error))
    if error is not None:
        raise error
    if message is not None:
        raise ConfigError(message)
    if then_all:
        return result if ctx.is_main else fn()
    return broadcast_object(result)


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (small objects: RNG states)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def sync_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Give every rank rank ``src``'s buffers (BN running statistics) before evaluating or saving."""
    if _active():
        for buf in module.buffers():
            dist.broadcast(buf, src=src)


# BN buffers are kept equal on every rank by lbsgd.models.ghost_bn (one all-reduce per step), so
# DDP's per-forward broadcast of rank 0's buffers is not needed. torch >= 2.13 names it
# forward_sync_buffers (and deprecates broadcast_buffers with a FutureWarning); it still
# broadcasts the buffers once at wrap time, when every rank's are equal anyway (the same seed, or
# the same checkpoint).
NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def wrap(
    model: torch.nn.Module,
    ctx: Context,
    bucket_cap_mb: float,
    comm_hook: str = "none",
    powersgd_rank: int = 1,
    switch_step: int = 0,
    noise=None,
) -> torch.nn.Module:
    """DDP over the process group when there is more than one process, else the model itself.

    DDP averages gradients over ranks with bucketed all-reduces that overlap the backward pass;
    ``bucket_cap_mb`` is the bucket size, i.e. tensor fusion (Horovod's fusion threshold), and
    ``comm_hook`` what each bucket's communication is (lbsgd.comm); ``noise``: a
    :class:`lbsgd.noise_scale.Probe` that reads each process's gradients before the all-reduce.
    """
    if ctx.world_size == 1:
        return model
    ddp = DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=True,
        **NO_FORWARD_BUFFER_SYNC,
    )
    ddp.comm_state = comm.register(
        ddp, comm_hook, ctx.local_world_size, powersgd_rank, switch_step, noise
    )
    return ddp


@contextlib.contextmanager
def no_sync(model: torch.nn.Module, skip: bool) -> Iterator[None]:
    """Skip DDP's gradient all-reduce on accumulation micro-steps (``skip=True``)."""
    if skip and isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    else:
        yield


# -- point-to-point messages (lbsgd.parameter_server) ------------------------------------------
# Asynchronous SGD has no collective: each worker talks to the server alone, and the server takes
# whichever worker's message comes first. Gloo receives from any source; NCCL only from a named
# peer, so on GPUs these messages go through a gloo group of their own (CPU tensors).


def p2p_group() -> Any:
    """The group for :func:`send` / :func:`recv`: None (the default group) when it is gloo, else a
    new gloo group of every process. Every process calls it, at the same point of its run."""
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def send(t: torch.Tensor, dst: int, tag: int, group: Any = None) -> None:
    """Send the CPU tensor ``t`` to rank ``dst``; messages of one tag between two ranks arrive in
    the order they were sent."""
    dist.send(t, dst=dst, group=group, tag=tag)


def recv(t: torch.Tensor, src: int | None, tag: int, group: Any = None) -> int:
    """Receive into the CPU tensor ``t`` from rank ``src``, or from whichever rank sends first
    when ``src`` is None; returns the sender's rank."""
    return dist.recv(t, src=src, group=group, tag=tag)
