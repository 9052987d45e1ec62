"""Analytic communication cost of data-parallel SGD: predicted step time and scaling efficiency.

An α–β model (one message of n bytes over one link costs α + n/β) of one gradient all-reduce per
step by a parameter server, a binary tree, a ring or Jia et al.'s hierarchical all-reduce (each
function states its formula), with or without DDP's overlap of the all-reduce with the backward
pass; weak-scaling efficiency E(p) = t_c / t(p). The figures in :data:`LINKS` are nominal datasheet
numbers, not measurements: fit measured timings with :func:`fit_alpha_beta` or
:func:`fit_ring_allreduce` before trusting a prediction for a particular cluster."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

ALGORITHMS = ("parameter_server", "tree", "ring", "hierarchical")

# fp32 gradient bytes: 4 × the parameter count of torchvision's model at 1000 classes.
GRADIENTS = {"resnet50": 25_557_032 * 4, "alexnet": 61_100_840 * 4}


def _positive(name: str, value: float, zero: bool = False) -> float:
    """``value`` as a float: a finite number > 0 (>= 0 with ``zero``), else a one-line ValueError
    naming ``name``."""
    real = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if not (real and math.isfinite(value) and (value > 0 or (zero and value == 0))):
        raise ValueError(
            f"{name}: must be a finite number {'>=' if zero else '>'} 0, got {value!r}"
        )
    return float(value)


def _count(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Link:
    """One link of the α–β model: a message of n bytes costs ``alpha_s + n / bandwidth_Bps``."""

    alpha_s: float
    bandwidth_Bps: float
    name: str = ""

    def __post_init__(self) -> None:
        _positive("alpha_s", self.alpha_s, zero=True)
        _positive("bandwidth_Bps", self.bandwidth_Bps)

    @classmethod
    def from_gbit(cls, gbit_per_s: float, latency_us: float, name: str = "") -> Link:
        """Link of ``gbit_per_s`` gigabit/s (10^9 bit/s) and ``latency_us`` microseconds."""
        _positive("gbit_per_s", gbit_per_s)
        _positive("latency_us", latency_us, zero=True)
        return cls(latency_us * 1e-6, gbit_per_s * 1e9 / 8, name)

    @classmethod
    def from_gbyte(cls, gbyte_per_s: float, latency_us: float, name: str = "") -> Link:
        """Link of ``gbyte_per_s`` gigabyte/s (10^9 B/s) and ``latency_us`` microseconds."""
        _positive("gbyte_per_s", gbyte_per_s)
        return cls.from_gbit(gbyte_per_s * 8, latency_us, name)

    def message_s(self, nbytes: float) -> float:
        """Seconds to send one message of ``nbytes``: α + n/β."""
        return self.alpha_s + nbytes / self.bandwidth_Bps


# Nominal figures (datasheet bandwidth, typical small-message latency), not measured here:
# - nvlink: V100 NVLink2, 6 links × 25 GB/s = 150 GB/s per direction per GPU (300 GB/s both ways).
# - pcie3: PCIe 3.0 x16, 15.75 GB/s raw, ~12 GB/s achieved by device-to-device copies.
# - ethernet_*: TCP over Ethernet, tens of µs per message (RoCE would be lower). 50 Gbit/s is the
#   Big Basin interconnect of Goyal et al. 2017 §5.
# - infiniband_edr: 4× EDR, 100 Gbit/s, ~1.5 µs MPI latency.
LINKS: dict[str, Link] = {
    "nvlink": Link.from_gbyte(150, 3.0, "nvlink"),
    "pcie3": Link.from_gbyte(12, 5.0, "pcie3"),
    "ethernet_10g": Link.from_gbit(10, 30.0, "ethernet_10g"),
    "ethernet_50g": Link.from_gbit(50, 20.0, "ethernet_50g"),
    "ethernet_100g": Link.from_gbit(100, 15.0, "ethernet_100g"),
    "infiniband_edr": Link.from_gbit(100, 1.5, "infiniband_edr"),
}


@dataclass(frozen=True)
class Cluster:
    """Nodes of ``gpus_per_node`` GPUs joined by ``intra`` links inside and ``inter`` links across."""

    intra: Link
    inter: Link
    gpus_per_node: int

    def __post_init__(self) -> None:
        _count("gpus_per_node", self.gpus_per_node)


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one step at ``workers`` workers (seconds; throughput in samples/s)."""

    algorithm: str
    workers: int
    comm_s: float
    step_s: float
    efficiency: float
    throughput: float | None


def parameter_server_time(grad_bytes: float, workers: int, link: Link) -> float:
    """T = 2α + 2·p·G/β: p gradients in and p copies out through the server's one link."""
    g = _positive("grad_bytes", grad_bytes)
    p = _count("workers", workers)
    if p == 1:
        return 0.0
    return 2 * link.alpha_s + 2 * p * g / link.bandwidth_Bps


def tree_time(grad_bytes: float, workers: int, link: Link) -> float:
    """T = 2·⌈log2 p⌉·(α + G/β): reduce up a binary tree, broadcast down, whole G per step."""
    g = _positive("grad_bytes", grad_bytes)
    p = _count("workers", workers)
    return 2 * (p - 1).bit_length() * link.message_s(g)  # (p-1).bit_length() == ceil(log2 p)


def ring_time(grad_bytes: float, workers: int, link: Link) -> float:
    """T = 2(p−1)·α + 2(p−1)/p·G/β: reduce-scatter + all-gather, 2(p−1) steps of G/p."""
    g = _positive("grad_bytes", grad_bytes)
    p = _count("workers", workers)
    return 2 * (p - 1) * link.message_s(g / p)


def hierarchical_time(
    grad_bytes: float, workers: int, gpus_per_node: int, intra: Link, inter: Link
) -> float:
    """Jia et al. 2018: with k = ``gpus_per_node`` and m = p/k nodes,

    T = 4(k−1)·(α_intra + G/(k·β_intra)) + 2(m−1)·(α_inter + G/(m·β_inter)).

    Intra-node reduce to the master and broadcast back are each 2(k−1) ring steps of G/k; the m
    masters ring-all-reduce the whole G in 2(m−1) steps of G/m. k = 1 is the flat ring on
    ``inter``; k = p (one node) is 4(p−1) intra steps, twice the flat ring on ``intra``.
    """
    g = _positive("grad_bytes", grad_bytes)
    p = _count("workers", workers)
    k = _count("gpus_per_node", gpus_per_node)
    if p % k:
        raise ValueError(
            f"workers: {p} is not a multiple of gpus_per_node={k}; use a multiple of {k}"
        )
    m = p // k
    return 4 * (k - 1) * intra.message_s(g / k) + 2 * (m - 1) * inter.message_s(g / m)


def comm_time(algorithm: str, grad_bytes: float, workers: int, cluster: Cluster) -> float:
    """Seconds of one all-reduce of ``grad_bytes`` over ``workers`` GPUs of ``cluster``.

    Flat algorithms (parameter_server, tree, ring) run on ``cluster.intra`` when all workers fit
    in one node and on ``cluster.inter`` otherwise. ``hierarchical`` uses both, with
    k = min(workers, gpus_per_node): a job smaller than a node fills part of one node.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"algorithm: unknown {algorithm!r}; expected one of {', '.join(ALGORITHMS)}"
        )
    p = _count("workers", workers)
    if algorithm == "hierarchical":
        k = min(p, cluster.gpus_per_node)
        return hierarchical_time(grad_bytes, p, k, cluster.intra, cluster.inter)
    link = cluster.intra if p <= cluster.gpus_per_node else cluster.inter
    flat = {"parameter_server": parameter_server_time, "tree": tree_time, "ring": ring_time}
    return flat[algorithm](grad_bytes, p, link)


def step_time(
    compute_s: float, comm_s: float, overlap: bool = True, backward_fraction: float = 2 / 3
) -> float:
    """t = t_c + T without overlap; t = t_c + max(0, T − f·t_c) with it (f = backward_fraction)."""
    tc = _positive("compute_s", compute_s)
    _positive("comm_s", comm_s, zero=True)
    if isinstance(backward_fraction, bool) or not (
        isinstance(backward_fraction, numbers.Real) and 0 <= backward_fraction <= 1
    ):
        raise ValueError(f"backward_fraction: must be in [0, 1], got {backward_fraction!r}")
    if not overlap:
        return tc + comm_s
    return tc + max(0.0, comm_s - backward_fraction * tc)


def predict(
    algorithm: str,
    grad_bytes: float,
    workers: int,
    compute_s: float,
    cluster: Cluster,
    overlap: bool = True,
    backward_fraction: float = 2 / 3,
    batch_per_worker: int | None = None,
) -> Prediction:
    """Step time, weak-scaling efficiency t_c/t(p) and (given ``batch_per_worker`` b) throughput
    p·b/t(p) of ``algorithm`` at ``workers`` GPUs; see :func:`comm_time` for the links used."""
    comm = comm_time(algorithm, grad_bytes, workers, cluster)
    t = step_time(compute_s, comm, overlap, backward_fraction)
    throughput = None
    if batch_per_worker is not None:
        throughput = workers * _count("batch_per_worker", batch_per_worker) / t
    return Prediction(algorithm, workers, comm, t, compute_s / t, throughput)


def sweep(
    algorithms: Iterable[str],
    grad_bytes: float,
    workers_list: Iterable[int],
    compute_s: float,
    cluster: Cluster,
    overlap: bool = True,
    backward_fraction: float = 2 / 3,
    batch_per_worker: int | None = None,
) -> list[Prediction]:
    """:func:`predict` for every algorithm × worker count, algorithm-major, in the given order."""
    algorithms, workers_list = list(algorithms), list(workers_list)
    if not algorithms:
        raise ValueError(f"algorithms: must name at least one of {', '.join(ALGORITHMS)}")
    if not workers_list:
        raise ValueError("workers_list: must hold at least one worker count >= 1")
    return [
        predict(a, grad_bytes, p, compute_s, cluster, overlap, backward_fraction, batch_per_worker)
        for a in algorithms
        for p in workers_list
    ]


def _timings(
    sizes_bytes: Sequence[float], times_s: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """The sizes and times of :func:`fit_alpha_beta` as arrays, one line for bad ones."""
    n = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if n.ndim != 1 or n.size < 2 or not np.all(np.isfinite(n)) or np.any(n <= 0):
        raise ValueError("sizes_bytes: must be at least two positive finite message sizes")
    if t.shape != n.shape or not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"times_s: must be {n.size} finite times >= 0, one per size")
    if np.unique(n).size < 2:
        raise ValueError("sizes_bytes: must hold at least two distinct sizes to separate α and β")
    return n, t


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> Link:
    """Least-squares fit of t = α + n/β to per-message timings; α is clipped at 0.

    The timings must be of one message over one link. For a collective, convert first: an
    all-reduce costs steps × (α + message/β), so divide times and sizes by its factors
    (:func:`fit_ring_allreduce` does this for the ring). When the unconstrained intercept is
    negative, α = 0 and 1/β is refitted through the origin.
    """
    n, t = _timings(sizes_bytes, times_s)
    scale = n.max()  # fit on n/scale for a well-conditioned design matrix
    design = np.column_stack([np.ones_like(n), n / scale])
    (alpha, slope), *_ = np.linalg.lstsq(design, t, rcond=None)
    if alpha < 0:
        alpha, slope = 0.0, float(np.dot(n / scale, t) / np.dot(n / scale, n / scale))
    if slope <= 0:
        raise ValueError("times_s: do not grow with sizes_bytes, so no positive bandwidth fits")
    return Link(float(alpha), float(scale / slope), "fitted")


def fit_ring_allreduce(
    sizes_bytes: Sequence[float], times_s: Sequence[float], workers: int
) -> Link:
    """Per-link α, β from ring all-reduce timings: fits t = 2(p−1)·α + 2(p−1)/p·n/β.

    Equivalent to :func:`fit_alpha_beta` on messages of n/p bytes taking t/(2(p−1)) seconds.
    """
    p = _count("workers", workers, minimum=2)
    n, t = np.asarray(sizes_bytes, dtype=float), np.asarray(times_s, dtype=float)
    return fit_alpha_beta(n / p, t / (2 * (p - 1)))  # checks them


def compute_from_step(
    step_s: float, comm_s: float, overlap: bool = True, backward_fraction: float = 2 / 3
) -> float:
    """The compute time t_c that :func:`step_time` turns into a measured step ``step_s``.

    Without overlap t = t_c + T, so t_c = t − T. With overlap t = t_c + max(0, T − f·t_c): when
    T ≤ f·t the communication hides entirely and t_c = t; otherwise t = (1 − f)·t_c + T, so
    t_c = (t − T) / (1 − f). A result ≤ 0 means the communication alone outlasts the step.
    """
    _positive("step_s", step_s)
    _positive("comm_s", comm_s, zero=True)
    if not 0 <= backward_fraction < 1:
        raise ValueError(f"backward_fraction: must be in [0, 1), got {backward_fraction!r}")
    if not overlap:
        return step_s - comm_s
    f = backward_fraction
    if comm_s <= f * step_s:
        return step_s
    return (step_s - comm_s) / (1 - f)
