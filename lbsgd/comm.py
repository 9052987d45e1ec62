"""How gradients travel between processes: DDP communication hooks and periodic model averaging.

``comm_hook`` (a hardware key) picks what DDP does with each gradient bucket: its own all-reduce,
torch's fp16/bf16 compression or PowerSGD hooks, or two written here, ``hierarchical`` (Jia et
al.'s two-level all-reduce over torchrun's nodes) and ``parameter_server`` (FireCaffe's baseline).
Those two queue their collectives inside the hook and hand DDP a completed future, so on NCCL the
backward pass still overlaps them. ``local_sgd`` (an experiment key) is post-local SGD, and
:class:`BMUF` filters its blocks with block momentum. docs/communication.md has the keys and tests."""

from __future__ import annotations

import math
from collections.abc import Callable
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
    switch_step: int = 0,
    noise=None,
):
    """Install ``hook`` (one of HOOKS) on a DDP model; ``none`` keeps DDP's all-reduce.

    ``noise``: a :class:`lbsgd.noise_scale.Probe` that reads each bucket's local gradients
    before the hook reduces them (``none`` then becomes torch's averaging all-reduce hook: the
    same sum, each gradient divided by the world size before it rather than multiplied by its
    inverse while copied into the bucket).

    ``switch_step``: PowerSGD compresses from this optimizer step on (the ``switch_step`` key,
    else the end of the warmup), and from step 2 at the earliest.

    Returns the hook's state (:class:`PowerSGD`: error feedback, factors, step counter), or None.
    """
    if hook not in HOOKS:
        raise ValueError(f"comm_hook={hook!r} is not one of {', '.join(HOOKS)}")
    state, fn = _hook(hook, local_world_size, powersgd_rank, switch_step)
    if hook == "none" and noise is not None:
        fn = default_hooks.allreduce_hook
    if fn is not None:
        ddp.register_comm_hook(state, fn if noise is None else noise.wrap(fn))
    return state if hook == "powersgd" else None


def _hook(hook: str, local_world_size: int, powersgd_rank: int, switch_step: int):
    """``hook``'s (state, function): (None, None) for DDP's own all-reduce."""
    if hook == "powersgd":
        state = PowerSGD(
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=max(2, switch_step),  # > 1: error feedback needs one plain step
            use_error_feedback=True,
            warm_start=True,
        )
        return state, powersgd_hook
    if hook == "hierarchical":
        return Groups(Topology.of(dist.get_world_size(), local_world_size)), hierarchical_hook
    stateless = {
        "none": None,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "parameter_server": parameter_server_hook,
    }
    return None, stateless[hook]


class _Blocks:
    """Local steps after the first ``start`` (synchronous) ones, in blocks of ``period`` steps
    whose ends every process leaves holding the same parameters."""

    def __init__(self, period: int, start: int):
        if period < 1:
            raise ValueError(f"local_sgd={period} must be >= 1 (0 turns local SGD off)")
        self.period, self.start = period, start

    def local(self, step: int) -> bool:
        """Whether optimizer step ``step`` (0-based) is local (no gradient all-reduce)."""
        return step >= self.start

    def in_sync(self, step: int) -> bool:
        """Whether every process holds the same parameters after optimizer step ``step`` (0-based)
        and its ``after_step``: the gradients were all-reduced, or a block ended there."""
        return step < self.start or (step - self.start) % self.period == 0


class LocalSGD(_Blocks):
    """Post-local SGD: after ``start`` steps, average the parameters every ``period`` steps.

    ``local(step)`` says whether the step's gradients stay on their process (no all-reduce);
    ``after_step(params)`` is called once after every optimizer step.
    """

    def __init__(self, period: int, start: int, step: int = 0):
        super().__init__(period, start)
        self.averager = PeriodicModelAverager(period=period, warmup_steps=start)
        self.averager.step = step

    def after_step(self, params) -> None:
        self.averager.average_parameters(params)

    @staticmethod
    def sync(params) -> None:
        """Average now (before evaluating or saving, so that every process holds the same model)."""
        average_parameters(iter(params), dist.group.WORLD)


# -- BMUF ------------------------------------------------------------------------------------------


def average_flat(flat: torch.Tensor) -> torch.Tensor:
    """Mean of a flat tensor over every process, in place (one all-reduce); unchanged on one."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        flat /= dist.get_world_size()  # as torch's average_parameters: divide, then sum
        dist.all_reduce(flat)
    return flat


def _flat(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


@torch.no_grad()
def _unflat(flat: torch.Tensor, params: list[torch.Tensor]) -> None:
    """Copy ``flat`` into the parameters, in place (their storage, hence the optimizer's and DDP's
    references to them, stays)."""
    parts = flat.split([p.numel() for p in params])
    for p, part in zip(params, parts, strict=True):
        p.copy_(part.view_as(p))


class BMUF(_Blocks):
    """Blockwise model-update filtering (Chen & Huo 2016, Algorithm 1 as the Jizhi slides give it)
    on the blocks of post-local SGD; the trainer drives it as it drives :class:`LocalSGD`.

    Block t is ``period`` = n local steps of each of the K processes from the same start W_g(t−1)
    (the first block after ``switch_step``, by default the warmup, is one step, as torch's
    averager places its first averaging: the blocks end where :meth:`LocalSGD.in_sync` says, and
    :meth:`in_sync`). At its end, with W(t−1) the global model and Δ(t−1) the last block update
    (W(0) = W_g(0) = the model at ``switch_step``, the same on every process; Δ(0) = 0)::

        W̄(t)  = (1/K) Σ_k W_k(t)              one all-reduce of the parameters
        G(t)  = W̄(t) − W_g(t−1)               block gradient
        Δ(t)  = η_B Δ(t−1) + ε_B G(t)         block momentum η_B, block learning rate ε_B
        W(t)  = W(t−1) + Δ(t)
        W_g(t) = W(t) + η_B Δ(t)              Nesterov-style start (NBM, ``nesterov``)
        W_g(t) = W(t)                         classical block momentum (CBM)

    and every process restarts from W_g(t). W and Δ are the same on every process (one copy each
    of the parameters, flat); W_g(t−1) is recomputed from them, bitwise what the restart copied.
    With η_B = 0 and ε_B = 1 this is plain model averaging (the trainer then keeps torch's
    averager: :func:`lbsgd.config.step_features.bmuf_filters`). K = 1 is Algorithm 1 with
    W̄ = W_1: the filter still applies. Every parameter takes part (gradient or not); buffers (BN running statistics, kept equal on
    every process by ghost BN's all-reduced group statistics) are not filtered.

    ``average(flat)`` returns the mean of ``flat`` over the processes (:func:`average_flat`; a
    test passes a fake one).
    """

    def __init__(
        self,
        *,
        period: int,
        start: int,
        step: int,
        params,
        block_momentum: float,
        block_lr: float,
        nesterov: bool = True,
        average: Callable[[torch.Tensor], torch.Tensor] = average_flat,
    ):
        super().__init__(period, start)
        if not 0 <= block_momentum < 1:
            raise ValueError(f"block_momentum={block_momentum} must be in [0, 1)")
        if not (math.isfinite(block_lr) and block_lr > 0):
            raise ValueError(f"block_lr={block_lr} must be a finite number > 0")
        self.step = step  # optimizer steps taken
        self.eta, self.eps, self.nesterov = block_momentum, block_lr, nesterov
        self.average = average
        params = list(params)
        self.device = params[0].device
        self.global_model: torch.Tensor | None = None  # W(t−1), flat; None before the first block
        self.delta: torch.Tensor | None = None  # Δ(t−1), flat
        if step >= start:  # resumed in the local phase: load_state_dict replaces this start
            self.begin(params)

    def begin(self, params: list[torch.Tensor]) -> None:
        """W(0) = W_g(0) = the parameters (every process holds the same), Δ(0) = 0."""
        self.global_model = _flat(params).clone()
        self.delta = torch.zeros_like(self.global_model)

    def block_start(self) -> torch.Tensor:
        """W_g = W + η_B Δ (Nesterov) or W: where every process starts the block."""
        if self.nesterov:
            return torch.add(self.global_model, self.delta, alpha=self.eta)
        return self.global_model.clone()

    def after_step(self, params) -> None:
        """Called once after every optimizer step."""
        params = list(params)
        step = self.step  # the optimizer step just taken (0-based)
        self.step += 1
        if step + 1 == self.start:  # the last synchronous step: the first block starts here
            self.begin(params)
        elif self.local(step) and self.in_sync(step):
            self.end_block(params)

    @torch.no_grad()
    def end_block(self, params: list[torch.Tensor]) -> None:
        """Algorithm 1's update at the end of a block; the parameters become W_g(t)."""
        g = self.average(_flat(params)).sub_(self.block_start())  # G(t) = W̄(t) − W_g(t−1)
        self.delta.mul_(self.eta).add_(g, alpha=self.eps)  # Δ(t) = η_B Δ(t−1) + ε_B G(t)
        self.global_model.add_(self.delta)  # W(t) = W(t−1) + Δ(t)
        _unflat(self.block_start(), params)  # every process restarts from W_g(t)

    def sync(self, params) -> None:
        """Average now (before evaluating or saving, as post-local SGD): every process holds W̄ of
        their current parameters; a block so cut goes on from there (G is still measured from
        W_g(t−1))."""
        params = list(params)
        _unflat(self.average(_flat(params)), params)

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """W(t−1) and Δ(t−1) (the same on every process: saved once); None before the first block."""
        if self.global_model is None:
            return None
        return {"global_model": self.global_model, "delta": self.delta}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.global_model = state["global_model"].to(self.device, copy=True)
        self.delta = state["delta"].to(self.device, copy=True)


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce: algorithm bandwidth × 2(p−1)/p (bytes/s)."""
    if seconds <= 0 or world_size < 2:
        return math.nan
    return nbytes / seconds * 2 * (world_size - 1) / world_size
