"""A run's network on its device: the micro-batch picked by ``micro_batch=auto``
(:func:`pick_micro_batch`), the inputs' memory format (:func:`memory_format`) and the one training
forward/backward that leaves no trace (:func:`backward_without_trace`: the micro-batch probe's, and
PowerSGD's bucket rebuild on resume).

Shared by the synchronous loop (lbsgd.trainer), the parameter server and evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lbsgd import distributed
from lbsgd.config import Config, ConfigError, micro_batch_candidates
from lbsgd.precision import Precision

# micro_batch=auto on a CPU: no memory probe (running out of host memory kills the process rather
# than raising), the largest candidate up to this many samples
CPU_AUTO_MICRO_BATCH = 256
# micro_batch=auto on a GPU: a candidate fits when its probe's peak memory stays under this share
# of the device's memory (the rest: optimizer state, DDP buckets, prefetched batches, fragmentation)
GPU_MEMORY_SHARE = 0.85


def memory_format(cfg: Config) -> torch.memory_format:
    """The memory format of the network's inputs: channels-last with ``channels_last=true``."""
    return torch.channels_last if cfg.channels_last else torch.contiguous_format


def backward_without_trace(
    model: torch.nn.Module,
    net: torch.nn.Module,
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    precision: Precision,
    device: torch.device,
) -> None:
    """One training forward/backward of ``model`` (``net``, or what wraps it) on ``batch()``'s
    inputs and labels that leaves no trace: ``net``'s buffers (BN statistics) and the RNG states
    (the host's, and ``device``'s on CUDA) restored, its gradients dropped, also when it raises
    (a probe's out-of-memory). ``batch`` is called inside, so its random draws leave none either."""
    buffers = [b.detach().clone() for b in net.buffers()]
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            x, y = batch()
            with precision.autocast():
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            del x, y, loss
    finally:
        net.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_(list(net.buffers()), buffers)


def pick_micro_batch(
    cfg: Config, ctx: distributed.Context, net: torch.nn.Module, splits, precision: Precision
) -> int:
    """``micro_batch=auto``: the largest multiple of bn_batch dividing the per-process share that
    fits the device. On CUDA each candidate, largest first, is probed with one training forward and
    backward on random inputs of the dataset's shape, leaving no trace (buffers, RNG, gradients
    restored); every process takes the smallest choice of all (the layout needs one micro-batch)."""
    candidates = micro_batch_candidates(cfg, ctx.world_size)
    if ctx.device.type != "cuda":
        choice = next((m for m in candidates if m <= CPU_AUTO_MICRO_BATCH), candidates[-1])
    else:
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        fits = (
            m
            for m in candidates
            if peak_memory(net, m, splits, cfg, ctx.device, precision) <= GPU_MEMORY_SHARE * total
        )
        choice = next(fits, 0)
        if not choice:
            raise ConfigError(
                f"micro_batch=auto: not even micro_batch={candidates[-1]} (one BN group of "
                f"bn_batch={cfg.bn_batch}) fits in the memory of {ctx.device}"
            )
    choice = -int(distributed.all_reduce_max(torch.tensor([-choice], device=ctx.device)).item())
    if ctx.is_main:
        print(f"lbsgd: micro_batch=auto -> {choice} (candidates {candidates})", flush=True)
    return choice


def peak_memory(
    net, m: int, splits, cfg: Config, device: torch.device, precision: Precision
) -> float:
    """Peak device memory (bytes) of one training forward/backward of ``m`` samples; inf when it
    does not fit."""
    fmt = memory_format(cfg)
    size = splits.image_size

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        torch.cuda.reset_peak_memory_stats(device)  # the buffers' copies are not the probe's
        x = torch.randn(m, 3, size, size, device=device).contiguous(memory_format=fmt)
        return x, torch.randint(0, splits.num_classes, (m,), device=device)

    torch.cuda.empty_cache()
    try:
        backward_without_trace(net, net, batch, precision, device)
        peak = float(torch.cuda.max_memory_allocated(device))
    except torch.cuda.OutOfMemoryError:
        peak = math.inf
    finally:
        torch.cuda.empty_cache()
    return peak
