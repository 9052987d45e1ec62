"""9. Mixed precision (Jia et al. 2018): fp32, bf16 and fp16 at the profile's large k, all other keys
equal, and the training throughput of each.

Jia et al. publish no fp32 counterpart, so the accuracy claims compare with this study's own fp32
runs, on the seeds the half-precision runs used (the same initialisation). On a CPU the fp16 run is
slow (no fast fp16 kernels), so the ``cpu`` profile runs bf16 and fp16 on one seed: such a lone
run is judged against every fp32 seed by Student's pooled t (it is taken to share fp32's spread).
The throughput claim concerns GPUs and stays undecided on a CPU. A diverged run counts as 100%
error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies.scales import Profile

STUDY = "mixed_precision"
TITLE = "9. Mixed precision (Jia et al. 2018)"
PRECISIONS = ("fp32", "bf16", "fp16")
# "reaches the accuracy of fp32", a non-inferiority margin in points of top-1 error: Jia et al.
# publish no fp32 run; the margin is the warmup and minibatch claims' (Goyal's 8k run +0.14
# over his baseline, his no-warmup run +1.24)
TOLERANCE_PCT = 1.0


def seeds_of(profile: Profile, seeds: Sequence[int], low_seeds: int | None = None) -> dict:
    """The seeds of each precision: fp32 all; bf16 and fp16 the first ``low_seeds`` (None: one on
    the cpu profile, where half precision is slow, else all)."""
    n_low = low_seeds or (1 if profile.name == "cpu" else len(seeds))
    return {"fp32": list(seeds), "bf16": list(seeds[:n_low]), "fp16": list(seeds[:n_low])}


def runs(
    profile: Profile,
    seeds: Sequence[int],
    ks: Sequence[float] | None = None,
    *,
    low_seeds: int | None = None,
) -> list[dict[str, Any]]:
    """Each precision at the large k (the last of ``ks``, else the profile's) on its seeds."""
    k = (list(ks) if ks else [profile.large_k])[-1]
    by = seeds_of(profile, seeds, low_seeds)
    return [profile.keys(k=k, precision=p, seed=s) for p in PRECISIONS for s in by[p]]


def prepare(df):
    """Diverged runs at 100% error, and the device each run trained on (``ran_on``, from its
    ``summary.json`` unless given; the config's ``device`` may say "auto")."""
    df = studies.diverged_as_failed(df)
    if "ran_on" not in df.columns:
        df["ran_on"] = [
            json.loads(Path(d, "summary.json").read_text())["environment"]["device"]
            for d in df["run_dir"]
        ]
    return df


def ours(df):
    """Per precision: error, throughput, skipped fp16 steps, diverged runs, speed against fp32."""
    df = prepare(df)
    by = ["k", "batch_size", "precision"]
    out = ex.summarize(df, by)
    for metric in ("img_per_s", "skipped_steps"):
        out = out.merge(ex.summarize(df, by, metric)[[*by, f"{metric}_mean"]], on=by)
    out = out.merge(df.groupby(by)["diverged"].sum().astype(int).reset_index(), on=by)
    order = [p for p in PRECISIONS if p in set(out["precision"])]
    out = out.set_index("precision").loc[order].reset_index()
    fp32 = out.loc[out["precision"] == "fp32", "img_per_s_mean"]
    out["speed_vs_fp32"] = (
        out["img_per_s_mean"] / float(fp32.iloc[0]) if len(fp32) else float("nan")
    )
    return out


def jia():
    """Jia et al.'s mixed-precision rows (all studies), with the top-1 accuracy of each."""
    ref = ex.reference()
    j = ref[ref["variant"].fillna("").str.contains("mixed precision")].copy()
    j["top1_acc_pct"] = [
        v if m == "top1_acc_pct" else float(nt.split()[-1])
        for v, m, nt in zip(j["value"], j["metric"], j["note"].fillna(""), strict=True)
    ]
    cols = ["study", "source", "model", "batch", "optimizer", "variant", "metric", "value"]
    return j[[*cols, "top1_acc_pct"]].astype({"batch": "Int64"}).reset_index(drop=True)


def table(df):
    """Ours per precision; beside the fp16 row Jia et al.'s mixed-precision 64k result with our
    optimizer (theirs is fp16 compute; they give no fp32 run)."""
    df = prepare(df)
    j = jia()
    ctx = j[(j["study"] == "lars") & (j["optimizer"] == df["optimizer"].iloc[0])]
    ctx = ctx.assign(precision="fp16", paper_top1_error_pct=100 - ctx["value"])[
        ["precision", "batch", "variant", "value", "paper_top1_error_pct"]
    ].rename(
        columns={"batch": "paper_batch", "variant": "paper_variant", "value": "paper_top1_acc_pct"}
    )
    t = ours(df).merge(ctx, on="precision", how="left")
    return t.astype({c: "Int64" for c in t if c in studies.INT_COLUMNS})


def throughput(df):
    """Training images per second per precision and device, and the speed against fp32."""
    df = prepare(df)
    t = ex.summarize(df, ["precision", "ran_on"], "img_per_s").rename(columns={"ran_on": "device"})
    order = [p for p in PRECISIONS if p in set(t["precision"])]
    t = t.set_index("precision").loc[order].reset_index()
    return t.merge(ours(df)[["precision", "speed_vs_fp32", "skipped_steps_mean"]], on="precision")


def findings(df) -> list[Finding]:
    """fp16 and bf16 reach fp32's accuracy (error no more than :data:`TOLERANCE_PCT` points
    above, a non-inferiority test: paired over the seeds they ran, a lone run against every fp32
    seed); mixed precision trains faster than fp32 (decided on a GPU only)."""
    df = prepare(df)
    o = ours(df)
    j = jia()
    out = [_reaches_fp32(df, p, o, j) for p in ("fp16", "bf16") if _common_seeds(df, p)]
    return [*out, _trains_faster(df, o, j)]


def _common_seeds(df, p: str) -> list[int]:
    """The seeds that ran both precision ``p`` and fp32."""
    low = df[df["precision"] == p]
    return sorted(set(low["seed"]) & set(df[df["precision"] == "fp32"]["seed"]))


def _reaches_fp32(df, p: str, o, j) -> Finding:
    """Precision ``p``'s error no more than :data:`TOLERANCE_PCT` points above fp32's
    (non-inferiority): paired over the seeds both ran when there are two; one run of ``p`` against
    every fp32 seed (Student's pooled t: the lone run taken to share fp32's spread)."""
    chance = studies.chance_of(df)
    k = float(df["k"].iloc[0])
    skipped = dict(zip(o["precision"], o["skipped_steps_mean"], strict=True))
    mp = j[(j["study"] == "lars") & (j["optimizer"] == "lars")].iloc[0]
    lars_mp = mp["top1_acc_pct"]
    reached = (
        f"{studies.cite(mp['source'])}: no fp32 counterpart published; mixed-precision ResNet-50 "
        f"at {studies.kilo(mp['batch'])} reaches {lars_mp:.1f}% accuracy with LARS"
    )
    fp32_all = studies.errors(df, precision="fp32")
    seeds = _common_seeds(df, p)
    e = [studies.errors(df, precision=p, seed=s)[0] for s in seeds]
    e32 = [studies.errors(df, precision="fp32", seed=s)[0] for s in seeds]
    ok = sum(a <= b + TOLERANCE_PCT for a, b in zip(e, e32, strict=True))
    n = len(seeds)
    if n >= 2:
        verdict = studies.no_worse(e, e32, TOLERANCE_PCT, chance=chance, paired=True)
        spread_note = ""
    else:
        verdict = studies.no_worse(e, fp32_all, TOLERANCE_PCT, chance=chance)
        spread_note = f"; one run against fp32's {len(fp32_all)} seeds"
    return studies.finding(
        f"{p} reaches the accuracy of fp32 (error no more than {TOLERANCE_PCT:g} point above)",
        verdict,
        f"{p} {sum(e) / n:.1f}% vs fp32 {sum(e32) / n:.1f}% error at k={k:g} (mean of the same "
        f"{n} seeds; within {TOLERANCE_PCT:g} points in {ok} of {n}; {skipped[p]:.0f} skipped "
        f"steps{spread_note}); Jia et al. publish no fp32 run: mixed precision ResNet-50 at 64k "
        f"reaches {lars_mp:.1f}% accuracy with LARS",
        paper=reached,
    )


def _trains_faster(df, o, j) -> Finding:
    """fp16 or bf16 faster than fp32 in images per second, decided on a GPU only."""
    ips = dict(zip(o["precision"], o["img_per_s_mean"], strict=True))
    devices = sorted(set(df["ran_on"]))
    fast = j[(j["metric"] == "train_minutes") & (j["model"] == "resnet50")]
    fast = fast.sort_values("value").iloc[0]
    on, where = ", ".join(devices), fast["variant"].removeprefix("Jia et al. ")
    verdict = studies.Verdict(
        None, f"the runs were on {on}, not a GPU (a CPU has no fast fp16 kernels)"
    )
    if all(d.startswith("cuda") for d in devices):  # "cuda" or "cuda:0"
        verdict = studies.Verdict(
            bool(max(ips.get("fp16", 0.0), ips.get("bf16", 0.0)) > ips["fp32"])
        )
    rates = ", ".join(f"{p} {ips[p]:.0f}" for p in PRECISIONS if p in ips)
    return studies.finding(
        "mixed precision trains faster than fp32 (on a GPU)",
        verdict,
        f"{rates} img/s on {on}; Jia et al. (mixed precision, ResNet-50 at {int(fast['batch'])}): "
        f"{fast['value']:g} min on {where}, top-1 {fast['top1_acc_pct']:g}%",
        paper=f"{studies.cite(fast['source'])}: qualitative, no fp32 time to compare; "
        f"mixed-precision ResNet-50 at {studies.kilo(fast['batch'])} in {fast['value']:g} min "
        f"on {where}, top-1 {fast['top1_acc_pct']:g}%",
    )
