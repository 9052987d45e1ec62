"""``lbsgd bench ghost-bn``: ghost BN's one pass against one batch-norm kernel per group (the
reference, :class:`PerGroupLoop`) and against plain BN over the whole micro-batch, in training
steps of the config's model (forward, backward, SGD update) at 2, 8 and 32 groups a micro-batch,
eager and compiled: images per second of each, alternating, and their ratios in one invocation."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn

try:
    import resource
except ImportError:  # not on Windows
    resource = None

from lbsgd import config, data, distributed, models
from lbsgd.bench.train import _AUTOCAST, DEFAULTS, alternating, bench_device, setup, write
from lbsgd.config import Config, ConfigError
from lbsgd.environment import environment
from lbsgd.models import ghost_bn

KERNELS = ("one_pass", "loop", "plain")


class PerGroupLoop(torch.autograd.Function):
    """Ghost BN as one native batch-norm kernel per group of n samples, forward and backward,
    each on its own contiguous slice: the reference the one pass is tested and timed against."""

    @staticmethod
    def forward(ctx, x, weight, bias, stats, n, eps):
        y = torch.empty_like(x)
        save = torch.empty(2, x.shape[0] // n, x.shape[1], device=x.device, dtype=torch.float32)
        outs = zip(y.split(n), save[0].unbind(), save[1].unbind(), strict=True)
        groups = zip(x.split(n), stats[0].unbind(), stats[1].unbind(), strict=True)
        for (xi, mean, var), out in zip(groups, outs, strict=True):
            torch.native_batch_norm(xi, weight, bias, mean, var, True, 1.0, eps, out=out)
        ctx.save_for_backward(x, weight, save)
        ctx.n, ctx.eps = n, eps
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, save = ctx.saved_tensors
        mask = [True, weight is not None, weight is not None]
        parts = zip(grad_y.split(ctx.n), x.split(ctx.n), save[0], save[1], strict=True)
        grads = [
            torch.ops.aten.native_batch_norm_backward(
                gy, xi, weight, None, None, mean, invstd, True, ctx.eps, mask
            )
            for gy, xi, mean, invstd in parts
        ]
        grad_x = torch.cat([g[0] for g in grads], out=torch.empty_like(x))  # in x's layout
        if weight is None:
            return grad_x, None, None, None, None, None
        grad_w = torch.stack([g[1] for g in grads]).sum(0)
        return grad_x, grad_w, torch.stack([g[2] for g in grads]).sum(0), None, None, None


def network(cfg: Config, kernel: str, groups: int, splits: data.Splits, device) -> nn.Module:
    """The config's model with BN over ``groups`` groups a micro-batch by ``kernel`` (plain: one
    BN group, the whole micro-batch)."""
    torch.manual_seed(cfg.seed)
    net = models.build(cfg, splits.num_classes, splits.image_size).to(device)
    m = cfg.micro_batch
    ghost_bn.convert(net, m if kernel == "plain" else m // groups)
    for bn in ghost_bn.ghost_modules(net):
        bn.kernel = PerGroupLoop if kernel == "loop" else ghost_bn.OnePassBatchNorm
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    return net.to(memory_format=fmt).train()


def keep_freed_memory() -> str:
    """Has glibc's malloc keep freed memory for reuse (no returns to the system, no fresh mappings
    for large blocks) and says what it did. Under its defaults a CPU training step of this size
    takes anywhere from 0 to ~4,000 page faults, by where earlier blocks happened to land, which
    moves a throughput by up to 15% between identical measurements and buries the kernels'
    difference; with freed memory kept every kernel runs fault-free after its first steps."""
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is None:
        return "system default (not glibc)"
    refused = [name for name, option in _OPTIONS.items() if not mallopt(option, 1 << 30)]
    if refused:  # mallopt returns 0 for a value it does not take
        return f"system default (mallopt refused {', '.join(refused)} = 1 GiB)"
    return "glibc, trim and mmap thresholds 1 GiB (freed memory kept for reuse)"


_OPTIONS = {"M_TRIM_THRESHOLD": -1, "M_MMAP_THRESHOLD": -3}  # glibc's malloc.h


def _page_faults() -> int:
    """Minor page faults of this process so far (0 where the platform does not count them)."""
    return 0 if resource is None else resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def images_per_s(cfg: Config, net: nn.Module, x, y, steps: int, device) -> tuple[float, float]:
    """Steady images per second of ``steps`` training steps (the first 3 untimed), and the page
    faults a timed step took."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    step = torch.compile(net) if cfg.compile else net
    dtype = _AUTOCAST[cfg.precision]
    for i in range(steps + 3):
        if i == 3:
            distributed.synchronize(device)
            t0, faults = time.perf_counter(), _page_faults()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(step(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    distributed.synchronize(device)
    return steps * len(y) / (time.perf_counter() - t0), (_page_faults() - faults) / steps


def bench_ghost(
    overrides: list[str],
    groups: Sequence[int] = (2, 8, 32),
    steps: int = 30,
    repeats: int = 3,
    out: str | None = None,
) -> dict:
    """Each group count's three kernels, ``repeats`` times alternating; the best of each."""
    given = config.parse_overrides(overrides)
    m = int(given.get("micro_batch", 128))  # one micro-batch a step; BN groups set per row
    _, cfg = setup(overrides, {**DEFAULTS, "micro_batch": m, "batch_size": m, "bn_batch": m})
    bad = [g for g in groups if g < 2 or m % g]
    if bad:
        raise ConfigError(
            f"--groups: {bad[0]} does not split micro_batch={m} into 2 or more groups"
        )
    device = bench_device(cfg)
    allocator = keep_freed_memory()
    splits = data.build(cfg, torch.device("cpu"))
    images, labels = splits.train.tensors
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    batch = (images[:m].to(device).contiguous(memory_format=fmt), labels[:m].to(device))
    rows = [_row(cfg, g, splits, batch, steps, repeats, device) for g in groups]
    result = {
        "benchmark": "ghost BN: one pass vs a kernel per group vs plain BN, training steps",
        "config": cfg.to_dict(),
        "steps": steps,
        "repeats": repeats,
        "allocator": allocator,
        "rows": rows,
        "environment": environment(device, 1),
    }
    write(result, out)
    return result


def _row(cfg: Config, g: int, splits, batch, steps: int, repeats: int, device) -> dict:
    """One group count: each kernel ``repeats`` times, alternating the order; printed."""
    m = cfg.micro_batch
    # compiled, the loop is left out: its kernels write into views of their outputs (out=),
    # which inductor refuses; the model used the folded formulation there before the one pass
    kernels = tuple(k for k in KERNELS if not (cfg.compile and k == "loop"))
    ips, faults = _measured(cfg, kernels, g, splits, batch, steps, repeats, device)
    best = {k: max(ips[k]) if k in ips else None for k in KERNELS}
    row = {
        "groups": g,
        "bn_batch": m // g,
        **{f"{k}_img_per_s": best[k] for k in KERNELS},
        "one_pass_over_loop": _ratio(best["one_pass"], best["loop"]),
        "one_pass_over_plain": _ratio(best["one_pass"], best["plain"]),
        "loop_over_plain": _ratio(best["loop"], best["plain"]),
        "all_img_per_s": ips,
        "page_faults_per_step": faults,
    }
    line = f"one pass {best['one_pass']:8.1f} img/s, plain BN {best['plain']:8.1f}"
    ratio = f"one pass / plain {row['one_pass_over_plain']:.3f}"
    if best["loop"] is None:
        line += f"; {ratio} (compiled: no loop)"
    else:
        line += (
            f", loop {best['loop']:8.1f}; one pass / loop {row['one_pass_over_loop']:.3f}, "
            f"{ratio} (loop / plain {row['loop_over_plain']:.3f})"
        )
    print(f"{g:>3} groups of {m // g:>3}: {line}", flush=True)
    return row


def _measured(cfg, kernels, g, splits, batch, steps, repeats, device) -> tuple[dict, dict]:
    """Each kernel's images per second and page faults a step, ``repeats`` times, alternating
    the order."""

    def measure(kernel: str) -> tuple[float, float]:
        return images_per_s(cfg, network(cfg, kernel, g, splits, device), *batch, steps, device)

    runs = alternating({k: lambda r, k=k: measure(k) for k in kernels}, repeats, cfg.compile)
    ips = {k: [speed for speed, _ in v] for k, v in runs.items()}
    return ips, {k: [faults for _, faults in v] for k, v in runs.items()}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b
