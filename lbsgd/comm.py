"""How gradients travel between processes: DDP communication hooks and periodic model averaging.

``comm_hook`` (a hardware key) picks what DDP does with each gradient bucket once the backward pass
has filled it (DDP's buckets overlap communication with the rest of the backward pass, and
``bucket_cap_mb`` sets their size: tensor fusion, Horovod's fusion threshold):

- ``none``: DDP's own all-reduce of the bucket, averaged over the processes (a ring on NCCL).
- ``fp16`` / ``bf16``: torch's compression hooks: the bucket is cast to 16 bits, all-reduced, and
  cast back (half the bytes on the wire; rounding of the sum to 16 bits).
- ``powersgd``: torch's PowerSGD hook (Vogels et al. 2019): rank-``powersgd_rank`` factors with error
  feedback and warm start; the plain all-reduce runs until the end of the learning-rate warmup.
- ``hierarchical``: Jia et al.'s two-level all-reduce, written here: the processes of a node reduce
  to the node's first process (its leader), the leaders all-reduce across nodes, and each leader
  broadcasts the result inside its node. Nodes are torchrun's: ``LOCAL_WORLD_SIZE`` processes per
  node, consecutive global ranks. Only the leaders use the slow inter-node links, one message each.
- ``parameter_server``: every process's gradient is reduced to rank 0, which sends the average back
  (FireCaffe's baseline; its cost grows linearly with the number of workers). A measured comparison,
  not a default.

The two hooks written here run their collectives inside the hook and hand DDP a completed future:
on NCCL the collectives are queued on the communication stream and the hook returns at once, so the
backward pass still overlaps them; on gloo (CPU) the hook waits for them.

``local_sgd`` (an experiment key: it changes the mathematics) is post-local SGD (Lin et al. 2020;
the BMUF family of the Jizhi slides): until the end of the learning-rate warmup every step
all-reduces gradients as usual; afterwards each process steps on its own gradients and the
parameters are averaged over all processes every ``local_sgd`` steps (torch's
``PeriodicModelAverager``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters

HOOKS = ("none", "fp16", "bf16", "powersgd", "hierarchical", "parameter_server")


@dataclass(frozen=True)
class Topology:
    """``nodes`` × ``per_node`` processes; node i holds global ranks i·per_node … (i+1)·per_node − 1."""

    nodes: int
    per_node: int

    @classmethod
    def of(cls, world_size: int, local_world_size: int) -> Topology:
        if local_world_size < 1 or world_size % local_world_size:
            raise ValueError(
                f"comm_hook=hierarchical needs the same number of processes on every node: "
                f"world_size={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}"
            )
        return cls(world_size // local_world_size, local_world_size)

    def node_ranks(self) -> list[list[int]]:
        """Global ranks of each node (the intra-node groups)."""
        k = self.per_node
        return [list(range(n * k, (n + 1) * k)) for n in range(self.nodes)]

    def peer_ranks(self) -> list[list[int]]:
        """Global ranks with the same local rank, one per node (the inter-node groups)."""
        k = self.per_node
        return [[n * k + local for n in range(self.nodes)] for local in range(k)]


class Groups:
    """The process subgroups of a topology; every rank must build them, in the same order."""

    def __init__(self, topo: Topology):
        self.topo = topo
        rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.leader = (rank // topo.per_node) * topo.per_node
        self.is_leader = rank == self.leader
        self.intra = self.inter = None
        if topo.per_node > 1:
            self.intra, _ = dist.new_subgroups_by_enumeration(topo.node_ranks())
        if topo.nodes > 1:
            self.inter, _ = dist.new_subgroups_by_enumeration(topo.peer_ranks())


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


# DDP checks a hook's annotations against its own types, which string annotations (this module's
# ``from __future__ import annotations``) fail: the two hooks below carry none.
def hierarchical_all_reduce(t: torch.Tensor, groups: Groups) -> torch.Tensor:
    """Sum ``t`` over every process in two levels, in place: reduce inside each node to its
    leader, all-reduce among the leaders, broadcast inside each node. Returns ``t``."""
    if groups.intra is not None:
        dist.reduce(t, dst=groups.leader, group=groups.intra)
    if groups.is_leader and groups.inter is not None:
        dist.all_reduce(t, group=groups.inter)
    if groups.intra is not None:
        dist.broadcast(t, src=groups.leader, group=groups.intra)
    return t


def hierarchical_hook(state, bucket):
    """The bucket averaged by :func:`hierarchical_all_reduce` (``state``: the Groups;
    ``bucket``: a dist.GradBucket; returns a completed Future)."""
    t = bucket.buffer()
    t.div_(state.world_size)
    return _done(hierarchical_all_reduce(t, state))


def parameter_server_hook(state, bucket):
    """Reduce every gradient to rank 0 (the server) and broadcast the average back."""
    t = bucket.buffer()
    t.div_(dist.get_world_size())
    dist.reduce(t, dst=0)
    dist.broadcast(t, src=0)
    return _done(t)


class PowerSGD(powerSGD_hook.PowerSGDState):
    """torch's PowerSGD state, with what a checkpoint needs: ``memories()`` / ``load_memories()``
    (this process's error feedback and warm-start factors, kept per DDP bucket, and the step
    counter), and ``plain`` to make the hook a plain all-reduce (see ``rebuild_buckets``)."""

    MEMORIES = ("iter", "error_dict", "p_memory_dict", "q_memory_dict")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plain = False

    def memories(self) -> dict:
        return {k: getattr(self, k) for k in self.MEMORIES}

    def load_memories(self, memories: dict) -> None:
        for k in self.MEMORIES:
            setattr(self, k, memories[k])


def powersgd_hook(state, bucket):
    """torch's PowerSGD hook, or a plain averaging all-reduce while ``state.plain``."""
    if state.plain:
        return default_hooks.allreduce_hook(None, bucket)
    return powerSGD_hook.powerSGD_hook(state, bucket)


def rebuild_buckets(ddp, state: PowerSGD, forward_backward) -> None:
    """Lay DDP's buckets out as they are after a first step, before any state is restored.

    DDP assigns gradients to buckets in parameter order at first and re-assigns them in the order
    the backward pass produced them after its first step; PowerSGD's memories are kept per bucket
    index. A resumed group must therefore run one step's backward before its memories are loaded,
    or they would meet other tensors. ``forward_backward()`` runs one forward/backward that changes
    nothing else (eval mode, gradients dropped); its all-reduce is plain, and the re-assignment
    happens at the next forward."""
    state.plain = True
    try:
        forward_backward()
    finally:
        state.plain = False


def register(
    ddp: torch.nn.parallel.DistributedDataParallel,
    hook: str,
    local_world_size: int,
    powersgd_rank: int = 1,
    warmup_steps: int = 0,
    noise=None,
):
    """Install ``hook`` (one of HOOKS) on a DDP model; ``none`` keeps DDP's all-reduce.

    ``noise``: a :class:`lbsgd.noise_scale.Probe` that reads each bucket's local gradients
    before the hook reduces them (``none`` then becomes torch's averaging all-reduce hook: the
    same sum, each gradient divided by the world size before it rather than multiplied by its
    inverse while copied into the bucket).

    Returns the hook's state (:class:`PowerSGD`: error feedback, factors, step counter), or None.
    """
    if hook not in HOOKS:
        raise ValueError(f"comm_hook={hook!r} is not one of {', '.join(HOOKS)}")
    state, fn = None, None
    if hook == "none":
        fn = default_hooks.allreduce_hook if noise is not None else None
    elif hook == "fp16":
        fn = default_hooks.fp16_compress_hook
    elif hook == "bf16":
        fn = default_hooks.bf16_compress_hook
    elif hook == "powersgd":
        state = PowerSGD(
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=max(2, warmup_steps),  # > 1: error feedback needs one plain step
            use_error_feedback=True,
            warm_start=True,
        )
        fn = powersgd_hook
    elif hook == "hierarchical":
        topo = Topology.of(dist.get_world_size(), local_world_size)
        state, fn = Groups(topo), hierarchical_hook
    else:
        fn = parameter_server_hook
    if fn is not None:
        ddp.register_comm_hook(state, fn if noise is None else noise.wrap(fn))
    return state if hook == "powersgd" else None


class LocalSGD:
    """Post-local SGD: after ``start`` steps, average the parameters every ``period`` steps.

    ``local(step)`` says whether the step's gradients stay on their process (no all-reduce);
    ``after_step(params)`` is called once after every optimizer step.
    """

    def __init__(self, period: int, start: int, step: int = 0):
        if period < 1:
            raise ValueError(f"local_sgd={period} must be >= 1 (0 turns local SGD off)")
        self.start = start
        self.averager = PeriodicModelAverager(period=period, warmup_steps=start)
        self.averager.step = step

    def local(self, step: int) -> bool:
        return step >= self.start

    def in_sync(self, step: int) -> bool:
        """Whether every process holds the same parameters after optimizer step ``step`` (0-based)
        and its ``after_step``: the gradients were all-reduced, or the parameters were averaged."""
        period = self.averager.period
        return step < self.start or (step - self.start) % period == 0

    def after_step(self, params) -> None:
        self.averager.average_parameters(params)

    @staticmethod
    def sync(params) -> None:
        """Average now (before evaluating or saving, so that every process holds the same model)."""
        average_parameters(iter(params), dist.group.WORLD)


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce: algorithm bandwidth × 2(p−1)/p (bytes/s)."""
    if seconds <= 0 or world_size < 2:
        return math.nan
    return nbytes / seconds * 2 * (world_size - 1) / world_size
