"""6. LARS (You et al. 2017, Tables 1 and 3; Jia et al. 2018): the profile's ResNet with SGD and
with LARS at each k of the profile's LARS list, and AlexNet-BN with both at the largest k.

The papers report top-1 accuracy; the table gives error = 100 − accuracy beside ours, mapped by
k = batch / 256. A diverged run counts as 100% error. The LARS keys (:func:`lars_keys`) are shared
with notebooks 7 and 8, so that their common runs are the same experiments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding, untrained
from lbsgd.lab.studies.scales import Profile

STUDY = "lars"
TITLE = "6. LARS (You et al. 2017, Jia et al. 2018)"
COLORS = {
    ("resnet", "sgd"): "tab:red",
    ("resnet", "lars"): "tab:green",
    ("alexnet_bn", "sgd"): "tab:orange",
    ("alexnet_bn", "lars"): "tab:blue",
}


# per profile: "lars", the keys of the LARS runs (You et al.); "alexnet", the keys of the AlexNet
# runs; "alexnet_lars", the LARS keys of the AlexNet runs (docs/studies.md, profile notes)
_LARS = {"schedule": "poly", "lars_eta": 0.001}
SETTINGS: dict[str, dict[str, Mapping[str, Any]]] = {
    "smoke": {
        "lars": {"base_lr": 0.25, **_LARS, "warmup_epochs": 0.5},
        "alexnet": {"synthetic_difficulty": "easy"},
    },
    # LARS at k = 128, where it first beats SGD; 0.5 per 16 and up diverge
    "cpu": {"lars": {"base_lr": 0.125, **_LARS}, "alexnet_lars": {"base_lr": 0.25}},
    # AlexNet on 10,000 images (25 of the replay's 104 runs, each 2.3x a ResNet run's time) and
    # its SGD at the probe's 0.025 per 16; LARS at k = 64: 0.25 per 16
    "fashion": {
        "lars": {"base_lr": 0.125, **_LARS},
        "alexnet": {"fashion_train": 10_000, "base_lr": 0.025},
        "alexnet_lars": {"base_lr": 0.25},
    },
    "fashion-long": {"lars": {"schedule": "poly", "poly_power": 2.0, "lars_eta": 0.001}},
    "cifar10": {"lars": {"base_lr": 0.5, **_LARS}},  # not calibrated yet
    # You et al. 2017 Table 3 (AlexNet-BN, 8K: lr 14, 5 warmup epochs, poly(2), 100 epochs)
    "imagenet": {
        "lars": {
            "base_lr": 0.44,
            **_LARS,
            "momentum": 0.9,
            "weight_decay": 5e-4,
            "epochs": 100,
            "nesterov": False,
        },
        "alexnet": {"model": "alexnet_bn", "weight_decay": 5e-4, "epochs": 100},
    },
}


def settings(profile: Profile, part: str = "lars") -> Mapping[str, Any]:
    """The profile's keys of ``part`` ("lars", "alexnet" or "alexnet_lars"; {} where none)."""
    return SETTINGS.get(profile.name, {}).get(part, {})


# -- the runs ----------------------------------------------------------------------------------


def own(keys: Mapping[str, Any], epochs: float | None) -> dict[str, Any]:
    """A profile's study keys, less their own ``epochs`` when the notebook sets every run's length."""
    return {k: v for k, v in keys.items() if epochs is None or k != "epochs"}


def lars_keys(
    profile: Profile,
    *,
    alexnet: bool = False,
    lars_base_lr: float | None = None,
    epochs: float | None = None,
) -> dict[str, Any]:
    """The profile's LARS keys (You et al.: plain momentum); ``alexnet`` adds its AlexNet LARS keys;
    ``lars_base_lr`` overrides the lr at the reference batch (notebooks 6 to 8 alike)."""
    keys = {**own(settings(profile), epochs), "optimizer": "lars", "nesterov": False}
    if alexnet:
        keys.update(own(settings(profile, "alexnet_lars"), epochs))
    if lars_base_lr is not None:
        keys["base_lr"] = lars_base_lr
    return keys


def runs(
    profile: Profile,
    seeds: Sequence[int],
    ks: Sequence[float] | None = None,
    *,
    lars_base_lr: float | None = None,
    epochs: float | None = None,
) -> list[dict[str, Any]]:
    """ResNet with SGD and LARS at each k (every seed at the largest, the first elsewhere), then
    AlexNet-BN with both at its k (``max(ks)``, else the profile's AlexNet k), every seed."""
    ks_ = sorted(ks or profile.ks["lars"])
    kmax = ks_[-1]
    kalex = max(ks) if ks else profile.alexnet_k()
    opts = ({}, lars_keys(profile, lars_base_lr=lars_base_lr, epochs=epochs))
    out = [
        profile.keys(k=k, **{**o, "seed": s})
        for k in ks_
        for o in opts
        for s in (seeds if k == kmax else seeds[:1])
    ]
    alex = own(settings(profile, "alexnet"), epochs)
    alex_opts = ({}, lars_keys(profile, alexnet=True, lars_base_lr=lars_base_lr, epochs=epochs))
    out += [
        profile.keys(k=kalex, **{**alex, "model": "alexnet_bn", **o, "seed": s})
        for o in alex_opts
        for s in seeds
    ]
    return out


# -- the table ---------------------------------------------------------------------------------


def arch(model: str) -> str:
    """The network family: every ResNet depth is "resnet" (the papers' ResNet-50)."""
    return "resnet" if model.startswith("resnet") else model


def prepare(df):
    """The runs as the study reads them: diverged runs at 100% error, and their ``arch``."""
    df = studies.diverged_as_failed(df)
    df["arch"] = [arch(m) for m in df["model"]]
    return df


def largest_k(df) -> dict[str, float]:
    """The k of each network's deciding comparison: its largest."""
    df = prepare(df)
    return {a: float(g["k"].max()) for a, g in df.groupby("arch")}


def ours(df):
    """Mean, spread and count of the error per network, optimizer and k, with diverged runs."""
    df = prepare(df)
    by = ["arch", "optimizer", "k", "batch_size", "lr"]
    return studies.summary(df, by)


def paper(archs: Sequence[str] | None = None):
    """The papers' rows (You et al., Jia et al.) of the networks ``archs``, as error by k."""
    p = ex.reference(STUDY)
    p = p[p["metric"] == "top1_acc_pct"].copy()
    p["arch"] = [arch(m) for m in p["model"]]
    if archs is not None:
        p = p[p["arch"].isin(set(archs))]  # the networks trained here (not plain AlexNet)
    p["k"] = p["batch"] / 256
    p["paper_top1_error_pct"] = 100 - p["value"]  # the papers give accuracy
    names = {  # the papers' column: ours
        "arch": "arch",
        "optimizer": "optimizer",
        "k": "k",
        "batch": "paper_batch",
        "lr": "paper_lr",
        "value": "paper_top1_acc_pct",
        "paper_top1_error_pct": "paper_top1_error_pct",
        "source": "paper_source",
        "variant": "paper_variant",
    }
    return p[list(names)].rename(columns=names)


# how each arm's lr was set: SGD's is not tuned here (study 14 tunes every optimizer alike)
TUNING = {
    "sgd": "untuned: the linear rule's lr and the profile's warmup (tuned: study 14)",
    "lars": "calibrated: the profile's LARS lr",
}
TUNED_ELSEWHERE = (
    "SGD here is untuned (the linear rule's lr, the profile's warmup); study 14 "
    "(14_optimizers) compares LARS with Nesterov tuned on the same budget"
)


def table(df):
    """Ours beside the papers, by network, optimizer and k (rows of either side alone kept);
    ``lr_setting`` says how our lr was set (SGD's untuned)."""
    df = prepare(df)
    t = ours(df).merge(paper(set(df["arch"])), on=["arch", "optimizer", "k"], how="outer")
    t = t.sort_values(["arch", "optimizer", "k"]).reset_index(drop=True)
    t.insert(t.columns.get_loc("lr") + 1, "lr_setting", [TUNING.get(o) for o in t["optimizer"]])
    t.loc[t["runs"].isna(), "lr_setting"] = None
    return t.astype({c: "Int64" for c in t if c in studies.INT_COLUMNS})


# -- the findings ------------------------------------------------------------------------------


def _paper_error(p, arch_: str, opt: str, batch: int | None = None) -> tuple[float, int]:
    """The paper's error at ``batch`` (default: its largest batch for the network and optimizer)."""
    r = p[(p["arch"] == arch_) & (p["optimizer"] == opt)]
    r = r[r["paper_batch"] == (batch or r["paper_batch"].max())]
    return float(r["paper_top1_error_pct"].iloc[0]), int(r["paper_batch"].iloc[0])


def _accuracy(p, arch_: str, batches: Sequence[int]) -> tuple[str, dict[tuple[str, int], float]]:
    """The papers' sources and accuracies (their unit) by (optimizer, batch) of ``arch_`` at
    ``batches``."""
    r = p[(p["arch"] == arch_) & p["paper_batch"].isin(list(batches))]
    acc = zip(r["optimizer"], r["paper_batch"], r["paper_top1_acc_pct"], strict=True)
    return studies.cite(*r["paper_source"]), {(o, int(b)): float(a) for o, b, a in acc}


def findings(df) -> list[Finding]:
    """LARS beats SGD at each network's largest k; from the smallest to the largest k the ResNet
    loses less with LARS than with SGD. Decided over seeds (:mod:`lbsgd.lab.studies`)."""
    df = prepare(df)
    chance = studies.chance_of(df)
    kmax = largest_k(df)
    p = paper()
    out = [
        _lars_beats_sgd(df, a, kmax[a], chance, p) for a in ("resnet", "alexnet_bn") if a in kmax
    ]
    res = df[df["arch"] == "resnet"]
    if res["k"].nunique() >= 2:  # none when no ResNet ran
        out.append(_lars_loses_less(res, kmax["resnet"], chance, p))
    return out


# the papers' network of each arch: who reports it, and its name
_PUBLISHED = {"resnet": ("Jia et al.", "ResNet-50"), "alexnet_bn": ("You et al.", "AlexNet-BN")}


def _lars_beats_sgd(df, a: str, k: float, chance: float | None, p) -> Finding:
    """At network ``a``'s largest k LARS's error is below SGD's (paired over seeds)."""
    lars = studies.errors(df, arch=a, optimizer="lars", k=k)
    sgd = studies.errors(df, arch=a, optimizer="sgd", k=k)
    w, n = studies.wins(df, "optimizer", "lars", "sgd", arch=a, k=k)
    who, name = _PUBLISHED[a]
    p_sgd, b = _paper_error(p, a, "sgd")
    p_lars, _ = _paper_error(p, a, "lars", b)
    quote = (
        f"{who} {name} at {b}: SGD {p_sgd:.1f} vs LARS {p_lars:.1f} "
        f"(accuracy {100 - p_sgd:.1f} vs {100 - p_lars:.1f})"
    )
    src, acc = _accuracy(p, a, [b])
    return studies.finding(
        f"at the largest minibatch LARS beats SGD at the linear rule's lr, untuned ({a})",
        studies.lower(lars, sgd, chance=chance, paired=True),
        f"k={k:g}: LARS {studies.mean(lars):.1f}% vs SGD {studies.mean(sgd):.1f}% error (mean of {len(lars)}; "
        f"LARS better in {w} of {n} seeds); paper error: {quote}; {TUNED_ELSEWHERE}",
        paper=f"{src}: {name} at {studies.kilo(b)} accuracy SGD {acc['sgd', b]:.1f}% vs LARS "
        f"{acc['lars', b]:.1f}%",
        budget=studies.budget(df[df["arch"] == a], [k]),
    )


# "start level": both optimizers' mean errors within this many points of each other at the k the
# loss is measured from (the closeness margin of the warmup and minibatch claims)
LEVEL_PTS = 1.0


def _level_k(res, kbig: float) -> float | None:
    """The smallest k below ``kbig`` at which LARS and SGD start level (mean errors within
    :data:`LEVEL_PTS`), None when they start level at none."""
    for k in sorted(set(res["k"])):
        if k >= kbig:
            break
        lars, sgd = (studies.errors(res, optimizer=o, k=k) for o in ("lars", "sgd"))
        if lars and sgd and abs(studies.mean(lars) - studies.mean(sgd)) <= LEVEL_PTS:
            return float(k)
    return None


def _lars_loses_less(res, kbig: float, chance: float | None, p) -> Finding:
    """From the smallest k where both optimizers start level to the largest, the ResNet's error
    grows less with LARS than with SGD: a loss measured from unequal starts would credit LARS
    with its own worse start."""
    you_sgd, b_sgd = _paper_error(p, "alexnet_bn", "sgd")
    you_lars, _ = _paper_error(p, "alexnet_bn", "lars", b_sgd)
    pds = you_sgd - _paper_error(p, "alexnet_bn", "sgd", 512)[0]
    pdl = you_lars - _paper_error(p, "alexnet_bn", "lars", 512)[0]
    src, acc = _accuracy(p, "alexnet_bn", [512, b_sgd])
    quote = f"paper, AlexNet-BN from 512 to {b_sgd}: LARS {pdl:+.1f} points, SGD {pds:+.1f} points"
    paper_words = (
        f"{src}: AlexNet-BN from 512 to {studies.kilo(b_sgd)} accuracy SGD "
        f"{acc['sgd', 512]:.1f}% to {acc['sgd', b_sgd]:.1f}%, LARS {acc['lars', 512]:.1f}% to "
        f"{acc['lars', b_sgd]:.1f}%"
    )
    kmin = _level_k(res, kbig)
    claim = (
        f"from the smallest k where both start level (within {LEVEL_PTS:g} point) to k={kbig:g} "
        "LARS loses less accuracy than SGD (resnet)"
    )
    if kmin is None:
        starts = "; ".join(
            f"k={k:g}: LARS {studies.mean(studies.errors(res, optimizer='lars', k=k)):.1f}% vs SGD "
            f"{studies.mean(studies.errors(res, optimizer='sgd', k=k)):.1f}%"
            for k in sorted(set(res["k"]))
            if k < kbig
        )
        verdict = studies.Verdict(
            None,
            f"LARS and SGD start level (within {LEVEL_PTS:g} point) at no smaller k: a loss "
            "measured from unequal starts would credit the optimizer that starts worse",
        )
        return studies.finding(claim, verdict, f"{starts}; {quote}", paper=paper_words)
    first = int(res[res["k"] == kmin]["seed"].min())
    verdict, change = _change(res, kmin, kbig, first, chance)
    return studies.finding(
        claim,
        verdict,
        f"from k={kmin:g}: error change LARS {studies.mean(change['lars']):+.1f} points, SGD {studies.mean(change['sgd']):+.1f} "
        f"points (k={kmin:g}: seed {first} only); {quote}",
        paper=paper_words,
        budget=studies.budget(res, [kmin, kbig]),
    )


def _change(
    res, kmin: float, kbig: float, first: int, chance: float | None
) -> tuple[studies.Verdict, dict[str, list[float]]]:
    """Each seed's error at the largest k less the first seed's at the smallest (the only one
    there), per optimizer, and whether LARS's change is below SGD's (paired over the seeds at the
    largest k; invalid when an arm did not train)."""
    change = {
        o: [
            e - studies.errors(res, optimizer=o, k=kmin, seed=first)[0]
            for e in studies.errors(res, optimizer=o, k=kbig)
        ]
        for o in ("lars", "sgd")
    }
    arms = {
        f"{o} k={k:g}": studies.errors(
            res, optimizer=o, k=k, **({} if k == kbig else {"seed": first})
        )
        for o in ("lars", "sgd")
        for k in (kmin, kbig)
    }
    failed = [f"{name}: {why}" for name, e in arms.items() if (why := untrained(e, chance))]
    if failed:
        return studies.Verdict(None, f"an arm did not train ({failed[0]})", invalid=True), change
    return studies.lower(change["lars"], change["sgd"], paired=True), change
