"""Run by tests/test_comm.py under torchrun: every comm hook against the flat all-reduce.

Each rank builds the same small network, feeds it its own data, and lets DDP (with one hook) average
the gradients of one backward pass; the reference is the mean of the ranks' plain gradients, taken
with an explicit all-reduce. Rank 0 writes, per hook, the largest relative difference to
``$OUT/<hook>.json``. PowerSGD is checked on a gradient of rank 1 (all ranks see the same single
sample of a bias-free linear layer), where a rank-1 approximation is exact.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lbsgd import comm


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 10),
    )


def grads_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    return [p.grad.detach().clone() for p in inner.parameters()]


def rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(
        ((u - v).norm() / v.norm().clamp_min(1e-30)).item() for u, v in zip(a, b, strict=True)
    )


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    g = torch.Generator().manual_seed(100 + rank)  # every rank its own data
    x, y = torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)

    reference = grads_of(net(), x, y)
    for t in reference:
        dist.all_reduce(t)
        t /= world
    results = {}
    for hook in ("none", "fp16", "bf16", "hierarchical", "parameter_server"):
        ddp = DistributedDataParallel(net(), bucket_cap_mb=0.001)  # several buckets
        comm.register(ddp, hook, local_world)
        results[hook] = rel_diff(grads_of(ddp, x, y), reference)

    # PowerSGD: a rank-1 gradient (one sample, the same on every rank), past its plain steps
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64, bias=False)
    ddp = DistributedDataParallel(lin)
    comm.register(ddp, "powersgd", local_world, powersgd_rank=1, switch_step=2)
    xs = torch.randn(1, 64, generator=torch.Generator().manual_seed(7))
    diffs = []
    for _ in range(4):  # steps 0-1: plain all-reduce; 2-3: rank-1 factors
        ddp.zero_grad(set_to_none=True)
        ddp(xs).square().sum().backward()
        expect = 2 * (lin.weight.detach() @ xs.T) @ xs  # d/dW sum((W x)^2) = 2 W x x^T
        diffs.append(((lin.weight.grad - expect).norm() / expect.norm()).item())
    results["powersgd"] = max(diffs)
    if rank == 0:
        for hook, d in results.items():
            with open(os.path.join(out, f"{hook}.json"), "w") as f:
                json.dump({"rel_diff": d, "world": world, "local_world": local_world}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
