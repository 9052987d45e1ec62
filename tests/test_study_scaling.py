"""Study 10 (lbsgd.lab.studies.scaling) on hand-made benchmark files: the α–β model of the all-reduce
against the measured multi-process steps, the published efficiencies between the model without and
with overlap, AlexNet against ResNet-50 at many workers, and the papers' numbers beside each
finding."""

import copy
import math

import pytest
from helpers import verdicts

from lbsgd.lab import experiments as ex
from lbsgd.lab.studies import scaling


def allreduce(alpha=1e-4, bandwidth=1e9) -> dict:
    """The shape of results/benchmarks/allreduce_cpu.json (lbsgd bench allreduce)."""
    rows = [
        {"path": p, "bytes": n, "seconds": t, "bus_bandwidth_Bps": n / t}
        for n, t in ((1024, 2e-4), (2**20, 2e-3))
        for p in ("flat", "hierarchical")
    ]
    return {
        "benchmark": "allreduce",
        "backend": "gloo",
        "world_size": 4,
        "nodes": 2,
        "processes_per_node": 2,
        "iters": 3,
        "rows": rows,
        "fits": {
            "flat_ring": {"alpha_s": alpha, "bandwidth_Bps": bandwidth},
            "hierarchical_effective": {"alpha_s": 0.0, "bandwidth_Bps": 5e8},
        },
    }


def breakdown(measured: dict[int, float], cores=4) -> dict:
    """The shape of results/benchmarks/steps_cpu.json (lbsgd bench train): 1 process (a 10 ms step,
    6 ms backward) and the measured steps of more, 1 MB of gradient."""

    def row(n, step, cap=25.0, hook="none"):
        return {
            "data": 1e-4,
            "forward": 3e-3,
            "backward": 0.6 * step,
            "optimizer": 5e-4,
            "step": step,
            "nproc": n,
            "micro_batch": 32,
            "batch_size": 32 * n,
            "comm_hook": hook,
            "bucket_cap_mb": cap,
            "grad_bytes": 1_000_000,
            "img_per_s": 32 * n / step,
        }

    rows = [row(1, 0.01, cap=1.0)] + [row(n, s) for n, s in measured.items()]
    rows.append(row(2, 1.0, hook="fp16"))  # a comm hook's layout: not the model's
    return {
        "benchmark": "data-parallel step breakdown",
        "rows": rows,
        "environment": {"cpu_count": cores, "threads_per_process": 1},
    }


def test_model_vs_measured_replayed_not_replayed_undecided():
    # the model: 2 and 4 processes on 4 cores, the ring all-reduce (1.2 and 2.1 ms) hides behind
    # the 6 ms backward: a 10 ms step
    check = scaling.model_vs_measured(breakdown({2: 0.011, 4: 0.012}), scaling.link(allreduce()))
    assert list(check["nproc"]) == [2, 4]
    assert list(check["predicted_step_s"]) == pytest.approx([0.01, 0.01])
    assert list(check["predicted_no_overlap_s"]) == pytest.approx([0.0112, 0.0121])
    f = scaling.findings(allreduce(), breakdown({2: 0.011, 4: 0.012}))[0]
    assert f.replayed is True
    assert "2 processes 0.91, 4 processes 0.83 (the claim: each within 0.75 to 1.25;" in f.evidence
    assert f.outcome == "measured"  # a ratio beside its band, no test
    assert "gloo on 4 cores; fit α=100 µs, β=1.00 GB/s" in f.evidence
    assert scaling.findings(allreduce(), breakdown({2: 0.011, 4: 0.02}))[0].replayed is False
    none = scaling.findings(allreduce(), breakdown({}))[0]
    assert none.replayed is None and "no multi-process step was measured" in none.evidence
    # 4 processes on 2 cores: compute doubles (20 ms)
    two = scaling.model_vs_measured(breakdown({4: 0.02}, cores=2), scaling.link(allreduce()))
    assert two["predicted_step_s"].iloc[0] == pytest.approx(0.02)


def test_link_falls_back_to_the_largest_message_without_a_fit():
    ar = allreduce()
    ar["fits"]["flat_ring"] = {"alpha_s": None, "bandwidth_Bps": None}
    link = scaling.link(ar)
    # ring: t = 2(p-1)/p * n/β at α = 0, from the 1 MiB flat message in 2 ms
    assert link.alpha_s == 0.0 and link.bandwidth_Bps == pytest.approx(1.5 * 2**20 / 2e-3)
    rows = scaling.allreduce_table(allreduce())
    assert rows["ring_model_s"].iloc[0] == pytest.approx(6 * (1e-4 + 256 / 1e9))
    env = {"threads_per_process": 2}  # a record from before cpu_count was recorded
    assert scaling.cores({"environment": env}) == 2


def test_published_efficiencies_between_the_model_without_and_with_overlap():
    f = scaling.findings(allreduce(), breakdown({2: 0.011}))
    assert verdicts(f[1:3]) == [True, True]
    assert "model 86.2% (no overlap) to 100.0% (full overlap) vs published 90.0%" in f[1].evidence
    assert "Goyal et al., 256 P100" in f[1].claim and "Jia et al., 2048 P40" in f[2].claim
    # a published 80% lies below the model without overlap
    ref = ex.reference()
    ref.loc[ref["variant"] == "8 to 256 P100 50Gbit Ethernet", "value"] = 80.0
    f = scaling.findings(allreduce(), breakdown({2: 0.011}), ref=ref)
    assert verdicts(f[1:3]) == [False, True]
    pub = scaling.published(ref)
    assert list(pub["paper_efficiency_pct"]) == [80.0, 80.0, 87.9, 87.9]
    assert pub["iteration_s"].iloc[0] == pytest.approx(60 * 60 / (90 * 1_281_167 / 8192))


def test_alexnet_scales_worse_at_many_workers_not_within_one_node():
    f = scaling.findings(allreduce(), breakdown({2: 0.011}))[3]
    assert f.replayed is True and f.claim.endswith("(predicted, 2048 workers, hierarchical)")
    # 8 workers in one NVLink node: both hide the all-reduce behind the backward pass
    f = scaling.findings(allreduce(), breakdown({2: 0.011}), workers=[8])[3]
    assert f.replayed is False and f.evidence == "AlexNet 100.0% vs ResNet-50 100.0%"
    pred = scaling.predicted(scaling.published(), [8, 16], gpus_per_node=8)
    assert len(pred) == 2 * 2 * 4 * 2  # models x overlap x algorithms x workers
    assert math.isclose(
        scaling.compute_per_step(scaling.published())["alexnet"],
        scaling.published()["compute_s"].iloc[0] * 0.72 / 4.1,
    )


def test_scaling_findings_do_not_change_their_inputs():
    ar, steps = allreduce(), breakdown({2: 0.011, 4: 0.012})
    before = copy.deepcopy((ar, steps))
    scaling.findings(ar, steps)
    assert (ar, steps) == before


# -- what the papers report, beside every finding ---------------------------------------------


def test_every_finding_of_study_10_carries_the_papers_numbers_and_source():
    own = "no published number: lbsgd's α–β model against this machine's own measured steps"
    fs = scaling.findings(allreduce(), breakdown({2: 0.011, 4: 0.012}))
    assert [f.paper for f in fs] == [
        own,
        "Goyal: 90% scaling efficiency (8 to 256 P100 50Gbit Ethernet)",
        "Mikami et al. table: 87.9% scaling efficiency (Jia et al. 2048 P40 100Gbit Ethernet)",
        "no published number: lbsgd's cost model predicts it (AlexNet: 61M parameters for 0.72 "
        "vs ResNet-50's 4.1 GMACs per image)",
    ]
    assert scaling.findings(allreduce(), breakdown({}))[0].paper == own  # nothing measured
