"""The α–β communication model of lbsgd.costmodel against hand-computed values."""

from __future__ import annotations

import pytest

from lbsgd import costmodel
from lbsgd.costmodel import (
    GRADIENTS,
    LINKS,
    Cluster,
    Link,
    comm_time,
    fit_alpha_beta,
    fit_ring_allreduce,
    hierarchical_time,
    parameter_server_time,
    predict,
    ring_time,
    step_time,
    sweep,
    tree_time,
)

G = 1e8  # 100 MB gradient
SLOW = Link(10e-6, 10e9)  # α = 10 µs, β = 10 GB/s
FAST = Link(2e-6, 100e9)  # α = 2 µs, β = 100 GB/s
CLUSTER = Cluster(intra=FAST, inter=SLOW, gpus_per_node=8)
COUNT = Link(1.0, 1e300)  # α = 1 s, β all but infinite: an all-reduce's time is its step count


def test_parameter_server_hand_value():
    # 2α + 2·p·G/β = 2e-5 + 2·8·1e8/1e10 = 2e-5 + 0.16
    assert parameter_server_time(G, 8, SLOW) == pytest.approx(0.16002, rel=1e-12)


def test_tree_hand_values_round_log2_up():
    # 2·⌈log2 8⌉·(α + G/β) = 6·(1e-5 + 0.01) = 0.06006; ⌈log2 5⌉ = 3 as well, ⌈log2 2⌉ = 1
    assert tree_time(G, 8, SLOW) == pytest.approx(0.06006, rel=1e-12)
    assert tree_time(G, 5, SLOW) == pytest.approx(0.06006, rel=1e-12)
    assert tree_time(G, 2, SLOW) == pytest.approx(0.02002, rel=1e-12)
    assert tree_time(G, 9, SLOW) == pytest.approx(0.08008, rel=1e-12)


def test_ring_hand_value():
    # 2(p−1)α + 2(p−1)/p·G/β = 14·1e-5 + 1.75·0.01 = 1.4e-4 + 0.0175
    assert ring_time(G, 8, SLOW) == pytest.approx(0.01764, rel=1e-12)


def test_hierarchical_hand_value():
    # p = 16, k = 4, m = 4:
    # intra 4(k−1)(α + G/(kβ)) = 12·(2e-6 + 1e8/4e11) = 12·2.52e-4 = 3.024e-3
    # inter 2(m−1)(α + G/(mβ)) = 6·(1e-5 + 1e8/4e10) = 6·2.51e-3 = 1.506e-2
    assert hierarchical_time(G, 16, 4, FAST, SLOW) == pytest.approx(0.018084, rel=1e-12)


def test_no_communication_for_one_worker():
    for algorithm in costmodel.ALGORITHMS:
        assert comm_time(algorithm, G, 1, CLUSTER) == 0.0
        pred = predict(algorithm, G, 1, 0.3, CLUSTER, overlap=False, batch_per_worker=32)
        assert pred.efficiency == 1.0
        assert pred.throughput == pytest.approx(32 / 0.3)


@pytest.mark.parametrize(
    "algorithm, p, k, expected",
    [
        ("parameter_server", 2, 1, 2),
        ("parameter_server", 64, 1, 2),
        ("tree", 2, 1, 2),
        ("tree", 8, 1, 6),
        ("tree", 9, 1, 8),
        ("tree", 1000, 1, 20),
        ("ring", 2, 1, 2),
        ("ring", 8, 1, 14),
        ("ring", 256, 1, 510),
        ("hierarchical", 8, 8, 28),  # 4·7 + 2·0
        ("hierarchical", 16, 4, 18),  # 4·3 + 2·3
        ("hierarchical", 64, 8, 42),  # 4·7 + 2·7
        ("hierarchical", 1024, 8, 282),  # 4·7 + 2·127
        ("hierarchical", 6, 1, 10),  # 4·0 + 2·5: the flat ring
    ],
)
def test_step_counts(algorithm, p, k, expected):
    assert comm_time(algorithm, G, p, Cluster(COUNT, COUNT, k)) == expected


def test_hierarchical_with_one_gpu_per_node_is_the_flat_ring_on_inter():
    for p in (2, 3, 8, 64):
        assert hierarchical_time(G, p, 1, FAST, SLOW) == pytest.approx(ring_time(G, p, SLOW))


def test_hierarchical_on_one_node_is_twice_the_intra_ring():
    # k = p = 8: 4·7·(1e-5 + 1e8/8e10) = 28·1.26e-3 = 0.03528 = 2 × ring_time(G, 8, SLOW)
    assert hierarchical_time(G, 8, 8, SLOW, FAST) == pytest.approx(0.03528, rel=1e-12)
    assert hierarchical_time(G, 8, 8, SLOW, FAST) == pytest.approx(2 * ring_time(G, 8, SLOW))


def test_flat_algorithms_pick_intra_inside_a_node_and_inter_across():
    # p = 8 on FAST: 14·2e-6 + 1.75·1e8/1e11 = 2.8e-5 + 1.75e-3
    assert comm_time("ring", G, 8, CLUSTER) == pytest.approx(1.778e-3, rel=1e-12)
    # p = 16 on SLOW: 30·1e-5 + 1.875·0.01 = 3e-4 + 0.01875
    assert comm_time("ring", G, 16, CLUSTER) == pytest.approx(0.01905, rel=1e-12)


def test_hierarchical_smaller_than_a_node_uses_that_many_gpus_of_one_node():
    # 4 workers on an 8-GPU node: k = 4, 12·(2e-6 + 1e8/4e11) = 3.024e-3, no inter-node part
    assert comm_time("hierarchical", G, 4, CLUSTER) == pytest.approx(3.024e-3, rel=1e-12)
    # 16 workers: k = 8, m = 2: 28·(2e-6 + 1.25e-4) + 2·(1e-5 + 5e-3) = 3.556e-3 + 0.01002
    assert comm_time("hierarchical", G, 16, CLUSTER) == pytest.approx(0.013576, rel=1e-12)


def test_overlap_hides_communication_up_to_the_backward_pass():
    # t_c = 0.3 s, f = 2/3: up to 0.2 s of communication is hidden
    assert step_time(0.3, 0.15) == 0.3
    assert step_time(0.3, 0.2) == pytest.approx(0.3)
    assert step_time(0.3, 0.35) == pytest.approx(0.45)  # 0.3 + (0.35 − 0.2)
    assert step_time(0.3, 0.15, overlap=False) == pytest.approx(0.45)
    assert step_time(0.3, 0.15, backward_fraction=0.25) == pytest.approx(0.375)  # 0.3 + 0.075


def test_prediction_efficiency_and_throughput_hand_values():
    # ring at p = 16 over SLOW: T = 0.01905; t_c = 0.3 s without overlap: t = 0.31905
    pred = predict("ring", G, 16, 0.3, CLUSTER, overlap=False, batch_per_worker=32)
    assert (pred.algorithm, pred.workers) == ("ring", 16)
    assert pred.comm_s == pytest.approx(0.01905, rel=1e-12)
    assert pred.step_s == pytest.approx(0.31905, rel=1e-12)
    assert pred.efficiency == pytest.approx(0.3 / 0.31905, rel=1e-12)
    assert pred.throughput == pytest.approx(16 * 32 / 0.31905, rel=1e-12)
    # with overlap the 0.01905 s are hidden behind 0.2 s of backward: efficiency exactly 1
    hidden = predict("ring", G, 16, 0.3, CLUSTER, batch_per_worker=32)
    assert hidden.efficiency == 1.0
    assert hidden.throughput == pytest.approx(16 * 32 / 0.3)
    # parameter server at p = 16: 2e-5 + 2·16·0.01 = 0.32002, 0.12002 s exposed
    ps = predict("parameter_server", G, 16, 0.3, CLUSTER)
    assert ps.step_s == pytest.approx(0.42002, rel=1e-12)
    assert ps.efficiency == pytest.approx(0.3 / 0.42002, rel=1e-12)
    assert ps.throughput is None


@pytest.mark.parametrize("overlap", [True, False])
def test_ring_efficiency_never_rises_with_workers(overlap):
    workers = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    preds = sweep(["ring"], GRADIENTS["resnet50"], workers, 0.05, CLUSTER, overlap=overlap)
    assert [p.workers for p in preds] == workers
    eff = [p.efficiency for p in preds]
    assert all(b <= a for a, b in zip(eff, eff[1:], strict=False))
    assert eff[0] == 1.0 and eff[-1] < 1.0


def test_sweep_is_algorithm_major():
    preds = sweep(["tree", "ring"], G, [2, 16], 0.3, CLUSTER)
    assert [(p.algorithm, p.workers) for p in preds] == [
        ("tree", 2),
        ("tree", 16),
        ("ring", 2),
        ("ring", 16),
    ]
    assert preds[3] == predict("ring", G, 16, 0.3, CLUSTER)


def test_parameter_server_grows_linearly_while_ring_bandwidth_stays_below_2g_over_beta():
    link = Link(0.0, 10e9)  # bandwidth terms only
    ps = [parameter_server_time(G, p, link) for p in (2, 4, 8, 16, 32)]
    # slope 2G/β = 0.02 s per worker: 0.04, 0.08, 0.16, 0.32, 0.64
    assert ps == pytest.approx([0.04, 0.08, 0.16, 0.32, 0.64], rel=1e-12)
    ring = [ring_time(G, p, link) for p in (2, 8, 64, 1024, 4096)]
    assert all(t < 2 * G / 10e9 for t in ring)
    assert ring == sorted(ring)
    assert ring[-1] == pytest.approx(0.02 * 4095 / 4096, rel=1e-12)


def test_fit_alpha_beta_recovers_noiseless_parameters():
    alpha, beta = 5e-6, 1.25e9
    sizes = [1e3, 1e5, 1e6, 1e7, 1e8]
    fitted = fit_alpha_beta(sizes, [alpha + n / beta for n in sizes])
    assert fitted.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fitted.bandwidth_Bps == pytest.approx(beta, rel=1e-9)


def test_fit_alpha_beta_clips_a_negative_latency():
    # t = n/1e10 − 1e-5 for n = 1, 2, 4 MB: 9e-5, 1.9e-4, 3.9e-4. With α = 0 the slope through the
    # origin is Σnt/Σn² = 2030/21e12, so β = 21e12/2030.
    fitted = fit_alpha_beta([1e6, 2e6, 4e6], [9e-5, 1.9e-4, 3.9e-4])
    assert fitted.alpha_s == 0.0
    assert fitted.bandwidth_Bps == pytest.approx(21e12 / 2030, rel=1e-9)


def test_fit_ring_allreduce_recovers_the_link():
    p = 8
    sizes = [1e4, 1e6, 1e7, 1e8]
    times = [ring_time(n, p, SLOW) for n in sizes]
    fitted = fit_ring_allreduce(sizes, times, p)
    assert fitted.alpha_s == pytest.approx(SLOW.alpha_s, rel=1e-6)
    assert fitted.bandwidth_Bps == pytest.approx(SLOW.bandwidth_Bps, rel=1e-9)


def test_link_helpers_and_presets():
    link = Link.from_gbit(50, 20)
    assert link.bandwidth_Bps == pytest.approx(6.25e9)
    assert link.alpha_s == pytest.approx(2e-5)
    assert Link.from_gbyte(12, 5).bandwidth_Bps == pytest.approx(12e9)
    assert LINKS["ethernet_50g"].bandwidth_Bps == pytest.approx(6.25e9)
    assert LINKS["infiniband_edr"].bandwidth_Bps == pytest.approx(12.5e9)
    assert LINKS["nvlink"].bandwidth_Bps == pytest.approx(150e9)
    assert LINKS["infiniband_edr"].alpha_s < LINKS["ethernet_100g"].alpha_s
    assert all(name == link.name for name, link in LINKS.items())


def test_gradient_presets_are_fp32_bytes_of_torchvision_parameter_counts():
    # sum(p.numel() for p in torchvision.models.resnet50().parameters()) == 25_557_032; alexnet 61_100_840
    assert GRADIENTS == {"resnet50": 102_228_128, "alexnet": 244_403_360}


def _bad(**overrides):
    kw = {
        "algorithm": "ring",
        "grad_bytes": G,
        "workers": 8,
        "compute_s": 0.3,
        "cluster": CLUSTER,
        "backward_fraction": 2 / 3,
    }
    kw.update(overrides)
    return lambda: predict(**kw)


@pytest.mark.parametrize(
    "call, argument",
    [
        (_bad(workers=0), "workers"),
        (_bad(workers=2.0), "workers"),
        (_bad(algorithm="allreduce"), "algorithm"),
        (_bad(algorithm="hierarchical", workers=12), "gpus_per_node"),
        (_bad(grad_bytes=0), "grad_bytes"),
        (_bad(grad_bytes=-1e6), "grad_bytes"),
        (_bad(compute_s=0), "compute_s"),
        (_bad(backward_fraction=1.5), "backward_fraction"),
        (_bad(batch_per_worker=0), "batch_per_worker"),
        (lambda: comm_time("ps", G, 8, CLUSTER), "algorithm"),
        (lambda: hierarchical_time(G, 10, 4, FAST, SLOW), "workers"),
        (lambda: hierarchical_time(G, 8, 0, FAST, SLOW), "gpus_per_node"),
        (lambda: Link(1e-5, 0), "bandwidth_Bps"),
        (lambda: Link(1e-5, -1e9), "bandwidth_Bps"),
        (lambda: Link(-1e-6, 1e9), "alpha_s"),
        (lambda: Link.from_gbit(0, 10), "gbit_per_s"),
        (lambda: Link.from_gbit(10, -1), "latency_us"),
        (lambda: Cluster(FAST, SLOW, 0), "gpus_per_node"),
        (lambda: sweep([], G, [8], 0.3, CLUSTER), "algorithms"),
        (lambda: fit_alpha_beta([0, 1e6], [1e-5, 1e-4]), "sizes_bytes"),
        (lambda: fit_alpha_beta([1e6, 1e6], [1e-4, 1e-4]), "sizes_bytes"),
        (lambda: fit_alpha_beta([1e5, 1e6], [1e-4]), "times_s"),
        (lambda: fit_alpha_beta([1e5, 1e6], [1e-4, 1e-5]), "times_s"),
        (lambda: fit_ring_allreduce([1e5, 1e6], [1e-4, 1e-3], 1), "workers"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument) as info:
        call()
    assert "\n" not in str(info.value)


def test_compute_from_step_inverts_step_time():
    # no overlap: 0.25 s step, 0.05 s all-reduce -> 0.20 s of compute
    assert costmodel.compute_from_step(0.25, 0.05, overlap=False) == pytest.approx(0.20)
    # overlap, f = 2/3: 0.1 s <= 2/3 x 0.25 s hides entirely -> t_c = t
    assert costmodel.compute_from_step(0.25, 0.1, overlap=True) == pytest.approx(0.25)
    # overlap, 0.2 s > 2/3 x 0.25: t_c = (0.25 - 0.2) / (1/3) = 0.15, and back: 0.15 + (0.2 - 0.1)
    t_c = costmodel.compute_from_step(0.25, 0.2, overlap=True)
    assert t_c == pytest.approx(0.15)
    assert costmodel.step_time(t_c, 0.2, overlap=True) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="backward_fraction"):
        costmodel.compute_from_step(0.25, 0.2, backward_fraction=1.0)
