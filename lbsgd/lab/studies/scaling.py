"""10. Scaling: communication cost, measured and predicted. Trains nothing: it reads (or makes) the
all-reduce and step-breakdown records of ``<results>/benchmarks/`` (``lbsgd bench allreduce`` and
``lbsgd bench train``: ``allreduce_cpu.json``, ``steps_cpu.json``), fits the α–β model to the
all-reduce timings, and sets the cost model (:mod:`lbsgd.costmodel`) beside the measured steps and
the published efficiencies: deterministic comparisons, no seeds (docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lbsgd import costmodel as cost
from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding

STUDY = "scaling"
TITLE = "10. Scaling (Goyal §4, Jia et al., FireCaffe)"
WORKERS = tuple(2**i for i in range(3, 12))  # 8 … 2048 predicted workers
NPROC = (1, 2, 4)  # process counts of the measured step breakdown
MODEL_TOLERANCE = 0.25  # "predicts the measured step within 25%"
IMAGES, EPOCHS = 1_281_167, 90  # ImageNet-1k train images, the published runs' epochs
ALEXNET_COMPUTE = 0.72 / 4.1  # AlexNet's compute per image over ResNet-50's (forward GMACs)
BATCH_PER_WORKER = 32  # weak scaling, as in Goyal et al.
# (label, train_minutes variant, efficiency_pct variant, GPUs, cluster, gradient bytes, algorithm):
# Goyal et al., 8 P100 per server on NVLink and 50 Gbit Ethernet, fp32 gradients; Jia et al.,
# 8 P40 per server on PCIe with 100 Gbit Ethernet, fp16 gradients (half the bytes), hierarchical.
CASES = (
    (
        "Goyal et al., 256 P100",
        "Goyal et al. 256x P100 Caffe2",
        "8 to 256 P100 50Gbit Ethernet",
        256,
        cost.Cluster(cost.LINKS["nvlink"], cost.LINKS["ethernet_50g"], 8),
        cost.GRADIENTS["resnet50"],
        "hierarchical",
    ),
    (
        "Jia et al., 2048 P40",
        "Jia et al. 2048x P40 TensorFlow mixed precision",
        "Jia et al. 2048 P40 100Gbit Ethernet",
        2048,
        cost.Cluster(cost.LINKS["pcie3"], cost.LINKS["ethernet_100g"], 8),
        cost.GRADIENTS["resnet50"] // 2,
        "hierarchical",
    ),
)


# -- the measurements --------------------------------------------------------------------------


def measure(
    bench_dir: str | Path,
    *,
    small: bool = False,
    nproc: Sequence[int] = NPROC,
    remeasure: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The all-reduce and step-breakdown records of ``bench_dir`` (``allreduce_cpu.json``,
    ``steps_cpu.json``), measured first (torchrun subprocesses) when absent or ``remeasure``;
    ``small``: tiny sizes and models (seconds, for the smoke profile)."""
    from lbsgd.bench import comm as bench_comm

    bench_dir = Path(bench_dir)
    bench_dir.mkdir(parents=True, exist_ok=True)
    ar_file, steps_file = bench_dir / "allreduce_cpu.json", bench_dir / "steps_cpu.json"
    if remeasure or not ar_file.exists():
        bench_comm.bench_allreduce(
            nproc=2 if small else 4,  # per node; small: 4 processes, on CI's 2 cores
            nodes=2,
            min_bytes=1024,
            max_bytes=2**20 if small else 2**28,
            iters=3 if small else 10,
            out=str(ar_file),
        )
    if remeasure or not steps_file.exists():
        keys = ["synthetic_train=512", "synthetic_test=64", "width=4"] if small else []
        bench_comm.bench_breakdown(
            keys, list(nproc), ["none"], [25.0], steps=3 if small else 40, out=str(steps_file)
        )
    return json.loads(ar_file.read_text()), json.loads(steps_file.read_text())


def link(ar: Mapping[str, Any]) -> cost.Link:
    """The α–β link of the measured flat (ring) all-reduce; when its timings were too noisy to
    separate α and β (tiny sizes): α = 0 and β from the largest flat message."""
    fit = ar["fits"]["flat_ring"]
    if fit.get("alpha_s") is not None and fit.get("bandwidth_Bps"):
        return cost.Link(fit["alpha_s"], fit["bandwidth_Bps"], "this machine (gloo)")
    p = ar["world_size"]
    big = max((r for r in ar["rows"] if r["path"] == "flat"), key=lambda r: r["bytes"])
    return cost.Link(0.0, 2 * (p - 1) / p * big["bytes"] / big["seconds"], "largest message")


def allreduce_table(ar: Mapping[str, Any]):
    """The measured all-reduce timings, each beside the fitted ring model's time."""
    import pandas as pd

    rows = pd.DataFrame(ar["rows"])
    fitted = link(ar)
    rows["ring_model_s"] = [cost.ring_time(n, ar["world_size"], fitted) for n in rows["bytes"]]
    return rows


def cores(steps: Mapping[str, Any]) -> int:
    """The cores of the machine that measured the steps (records made before ``cpu_count`` was
    recorded: torch's default thread count, which is that machine's cores)."""
    env = steps["environment"]
    return int(env.get("cpu_count") or env["threads_per_process"])


def step_table(steps: Mapping[str, Any]):
    """The measured step breakdowns, with the throughput over one process's."""
    import pandas as pd

    st = pd.DataFrame(steps["rows"])
    one = st[st["nproc"] == 1].iloc[0]
    st["speedup_vs_1"] = st["img_per_s"] / one["img_per_s"]
    return st


def model_vs_measured(steps: Mapping[str, Any], fitted: cost.Link):
    """The model's p-process step from the 1-process measurement, beside the measured one.

    Compute t_c: the 1-process step times max(1, p / cores) (processes beyond the cores share
    them); communication: the fitted ring all-reduce of the gradient; overlap: the backward share
    f of the 1-process step. Rows: the measured layouts without a comm hook at the largest bucket.
    """
    import pandas as pd

    st = pd.DataFrame(steps["rows"])
    one = st[st["nproc"] == 1].iloc[0]
    flat = st[(st["comm_hook"] == "none") & (st["bucket_cap_mb"] == st["bucket_cap_mb"].max())]
    n_cores = cores(steps)
    f = one["backward"] / one["step"]
    rows = []
    for _, r in flat.iterrows():
        n = int(r["nproc"])
        t_c = one["step"] * max(1.0, n / n_cores)
        comm = cost.ring_time(r["grad_bytes"], n, fitted) if n > 1 else 0.0
        rows.append(
            {
                "nproc": n,
                "grad_bytes": r["grad_bytes"],
                "measured_step_s": r["step"],
                "predicted_step_s": cost.step_time(t_c, comm, overlap=True, backward_fraction=f),
                "predicted_no_overlap_s": cost.step_time(t_c, comm, overlap=False),
                "measured_img_per_s": r["img_per_s"],
            }
        )
    check = pd.DataFrame(
        rows,
        columns=[
            "nproc",
            "grad_bytes",
            "measured_step_s",
            "predicted_step_s",
            "predicted_no_overlap_s",
            "measured_img_per_s",
        ],
    )
    check["predicted_over_measured"] = check["predicted_step_s"] / check["measured_step_s"]
    return check


# -- the published runs and the predictions ----------------------------------------------------


def published(ref=None):
    """For each published run (:data:`CASES`): its iteration time (from its training time), the
    model's all-reduce time with nominal links, the compute that leaves with and without overlap,
    the predicted efficiency, and the published one. ``ref``: the reference table (default the
    project's copy of the papers)."""
    import pandas as pd

    ref = ex.reference() if ref is None else ref
    ttt = ref[ref["metric"] == "train_minutes"]
    eff = ref[ref["metric"] == "efficiency_pct"]
    out = []
    for label, tv, ev, gpus, cluster, g, algo in CASES:
        t = ttt[ttt["variant"] == tv].iloc[0]
        step = t["value"] * 60 / (EPOCHS * IMAGES / t["batch"])
        comm = cost.comm_time(algo, g, gpus, cluster)
        for overlap in (True, False):
            t_c = cost.compute_from_step(step, comm, overlap=overlap)
            out.append(
                {
                    "run": label,
                    "algorithm": algo,
                    "overlap": overlap,
                    "paper_gpus": gpus,
                    "iteration_s": step,
                    "comm_s": comm,
                    "compute_s": t_c,
                    "predicted_efficiency_pct": max(0.0, 100 * t_c / step),
                    "paper_efficiency_pct": float(eff[eff["variant"] == ev]["value"].iloc[0]),
                }
            )
    return pd.DataFrame(out)


def compute_per_step(pub) -> dict[str, float]:
    """Compute seconds per step: ResNet-50's from Goyal et al.'s run (overlap), AlexNet's from it
    by the ratio of forward multiply-adds per image."""
    goyal = pub[(pub["paper_gpus"] == 256) & pub["overlap"]].iloc[0]
    return {
        "resnet50": float(goyal["compute_s"]),
        "alexnet": float(goyal["compute_s"]) * ALEXNET_COMPUTE,
    }


def predicted(pub, workers: Sequence[int] = WORKERS, gpus_per_node: int = 8):
    """Predicted efficiency of every algorithm, with and without overlap, at each worker count,
    for ResNet-50 and AlexNet on Goyal et al.'s cluster (NVLink, 50 Gbit Ethernet)."""
    import pandas as pd

    cluster = cost.Cluster(cost.LINKS["nvlink"], cost.LINKS["ethernet_50g"], gpus_per_node)
    rows = []
    for model, t_c in compute_per_step(pub).items():
        for overlap in (True, False):
            for pr in cost.sweep(
                cost.ALGORITHMS,
                cost.GRADIENTS[model],
                list(workers),
                t_c,
                cluster,
                overlap=overlap,
                batch_per_worker=BATCH_PER_WORKER,
            ):
                rows.append(
                    {
                        "model": model,
                        "overlap": overlap,
                        "algorithm": pr.algorithm,
                        "workers": pr.workers,
                        "comm_s": pr.comm_s,
                        "step_s": pr.step_s,
                        "efficiency_pct": 100 * pr.efficiency,
                        "images_per_s": pr.throughput,
                    }
                )
    return pd.DataFrame(rows)


# -- the findings ------------------------------------------------------------------------------


def findings(
    ar: Mapping[str, Any],
    steps: Mapping[str, Any],
    *,
    workers: Sequence[int] = WORKERS,
    gpus_per_node: int = 8,
    ref=None,
) -> list[Finding]:
    """The fitted model predicts the measured multi-process steps within
    :data:`MODEL_TOLERANCE` (undecided without a multi-process measurement); each published
    efficiency lies between the model without and with overlap; AlexNet scales worse than
    ResNet-50 at the most workers (hierarchical, overlap)."""
    measured = _model_predicts_steps(ar, steps)
    pub = published(ref)
    return [
        measured,
        *_published_within_model(pub, ref),
        _alexnet_scales_worse(pub, workers, gpus_per_node),
    ]


def _model_predicts_steps(ar: Mapping[str, Any], steps: Mapping[str, Any]) -> Finding:
    """The fitted model's multi-process steps within :data:`MODEL_TOLERANCE` of the measured."""
    fitted = link(ar)
    check = model_vs_measured(steps, fitted)
    multi = check[check["nproc"] > 1]
    fit_text = (
        f"gloo on {cores(steps)} cores; fit α={fitted.alpha_s * 1e6:.0f} µs, "
        f"β={fitted.bandwidth_Bps / 1e9:.2f} GB/s"
    )
    claim = (
        f"the α–β model with a measured fit predicts the measured multi-process CPU step "
        f"within {MODEL_TOLERANCE:.0%}"
    )
    own = "no published number: lbsgd's α–β model against this machine's own measured steps"
    if multi.empty:
        return studies.finding(
            claim,
            studies.Verdict(None, "no multi-process step was measured"),
            f"({fit_text})",
            paper=own,
        )
    worst = float((multi["predicted_over_measured"] - 1).abs().max())
    return studies.finding(
        claim,
        studies.Verdict(worst <= MODEL_TOLERANCE),
        "predicted / measured step: "
        + ", ".join(
            f"{int(n)} processes {v:.2f}"
            for n, v in zip(multi["nproc"], multi["predicted_over_measured"], strict=True)
        )
        + f" (the claim: each within {1 - MODEL_TOLERANCE:.2f} to {1 + MODEL_TOLERANCE:.2f}; "
        f"{fit_text})",
        paper=own,
    )


def _published_within_model(pub, ref) -> list[Finding]:
    """Per published run: its efficiency between the model without and with overlap."""
    eff = ex.reference() if ref is None else ref
    eff = eff[eff["metric"] == "efficiency_pct"]
    return [_published_run(run, g, eff) for run, g in pub.groupby("run", sort=False)]


def _published_run(run: str, g, eff) -> Finding:
    on, off = (g[g["overlap"] == v].iloc[0] for v in (True, False))
    paper = on["paper_efficiency_pct"]
    variant = next(c[2] for c in CASES if c[0] == run)
    source = eff[eff["variant"] == variant]["source"].iloc[0]
    lo, hi = off["predicted_efficiency_pct"], on["predicted_efficiency_pct"]
    return studies.finding(
        f"the published efficiency of {run} lies between the model without and with overlap",
        studies.Verdict(bool(lo <= paper <= hi)),
        f"model {lo:.1f}% (no overlap) to {hi:.1f}% (full overlap) vs published {paper:.1f}% "
        f"({on['algorithm']} all-reduce {on['comm_s'] * 1e3:.0f} ms of a "
        f"{on['iteration_s'] * 1e3:.0f} ms iteration; nominal links)",
        paper=f"{studies.cite(source)}: {paper:g}% scaling efficiency ({variant})",
    )


def _alexnet_scales_worse(pub, workers: Sequence[int], gpus_per_node: int) -> Finding:
    """At the most workers (hierarchical, overlap) AlexNet's predicted efficiency below ResNet-50's."""
    pred = predicted(pub, workers, gpus_per_node)
    most = max(workers)
    top = pred[(pred["workers"] == most) & pred["overlap"] & (pred["algorithm"] == "hierarchical")]
    top = top.set_index("model")["efficiency_pct"]
    return studies.finding(
        f"AlexNet scales worse than ResNet-50 (predicted, {most} workers, hierarchical)",
        studies.Verdict(bool(top["alexnet"] < top["resnet50"])),
        f"AlexNet {top['alexnet']:.1f}% vs ResNet-50 {top['resnet50']:.1f}%",
        paper="no published number: lbsgd's cost model predicts it (AlexNet: 61M parameters "
        "for 0.72 vs ResNet-50's 4.1 GMACs per image)",
    )
