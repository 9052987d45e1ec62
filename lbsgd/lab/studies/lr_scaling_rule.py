"""4. Learning-rate scaling rules (Goyal et al. 2017, Table 2a): the large minibatch with gradual
warmup under the linear, square-root and no scaling of the learning rate, over the profile's seeds
(paired: seed s gives the same initialisation and data order under every rule).

The linear-rule runs are the gradual-warmup runs of study 2 (copied when it ran first). A diverged
run counts as 100% error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import every, mean
from lbsgd.lab.studies.scales import Profile

STUDY = "lr_scaling_rule"
TITLE = "4. Learning-rate scaling rules (Goyal Table 2a)"
RULES = ("linear", "sqrt", "none")
COLLAPSE_PCT = 5.0  # "collapses": Goyal's no-scaling run is 17.9 points worse than the linear rule


def runs(
    profile: Profile, seeds: Sequence[int], ks: Sequence[float] | None = None
) -> list[dict[str, Any]]:
    """The large k (last of ``ks``, default the profile's ``large_k``) under each rule, every
    seed."""
    large_k = (ks or [profile.large_k])[-1]
    return [profile.keys(k=large_k, lr_scaling=r, seed=s) for r in RULES for s in seeds]


prepare = studies.diverged_as_failed  # diverged runs at 100% error (``diverged`` column)


def rule(batch: float, lr: float, base_lr: float = 0.1, base_batch: int = 256) -> str | None:
    """The rule that gives ``lr`` at ``batch`` from 0.1 per 256 images (None: another base lr)."""
    k, f = batch / base_batch, lr / base_lr
    for name, g in (("linear", k), ("sqrt", k**0.5), ("none", 1.0)):
        if abs(f / g - 1) < 0.01:
            return name
    return None


def paper():
    """Table 2a's rows at 8k that are a rule (the 0.05 × 32 and 0.2 × 32 rows vary the base lr
    instead; at 256 every rule gives the same lr)."""
    p = ex.reference(STUDY)
    p = p[p["batch"] > 256].copy()
    p["lr_scaling"] = [rule(b, lr) for b, lr in zip(p["batch"], p["lr"], strict=True)]
    names = {
        "batch": "paper_batch",
        "lr": "paper_lr",
        "value": "paper_top1_error_pct",
        "std": "paper_std",
        "variant": "paper_variant",
    }
    p = p.dropna(subset=["lr_scaling"])[["lr_scaling", *names]]
    return p.rename(columns=names).reset_index(drop=True)


def table(df):
    """Mean error and diverged runs per rule beside Table 2a, in the order linear, sqrt, none."""
    df = prepare(df)
    by = ["k", "batch_size", "lr_scaling", "lr"]
    ours = studies.summary(df, by)
    t = ours.merge(paper(), on="lr_scaling", how="left")
    order = {r: i for i, r in enumerate(RULES)}
    t = t.sort_values("lr_scaling", key=lambda c: c.map(order)).reset_index(drop=True)
    t = t[["lr_scaling", *(c for c in t if c != "lr_scaling")]]
    t = studies.k_as_paper_batch(t)
    return t.astype({c: "Int64" for c in t if c in studies.INT_COLUMNS})


def findings(df) -> list[Finding]:
    """The linear rule is the best of the three; no scaling is over 5 points worse than linear.
    Decided over seeds (:mod:`lbsgd.lab.studies`); the evidence counts the seeds linear wins."""
    df = prepare(df)
    chance, large_k = studies.chance_of(df), float(df["k"].max())
    e = {r: studies.errors(df, lr_scaling=r) for r in RULES}
    m, n = {r: mean(v) for r, v in e.items()}, len(e["linear"])
    per_seed = df.pivot_table(
        index="seed", columns="lr_scaling", values="final_top1_error_pct"
    ).dropna()
    # seeds where linear's error is below both others', of the seeds that ran all three rules
    wins = int((per_seed["linear"] < per_seed[["sqrt", "none"]].min(axis=1)).sum())
    ref = ex.reference(STUDY)
    p = dict(zip(paper()["lr_scaling"], paper()["paper_top1_error_pct"], strict=True))
    src, big = studies.cite(*ref["source"]), studies.kilo(ref["batch"].max())
    b = studies.budget(df, [large_k])
    return [
        studies.finding(
            "the linear rule gives the lowest error of the three rules at the large minibatch",
            every(
                studies.lower(e["linear"], e["sqrt"], chance=chance, paired=True),
                studies.lower(e["linear"], e["none"], chance=chance, paired=True),
            ),
            f"linear {m['linear']:.1f}%, sqrt {m['sqrt']:.1f}%, none {m['none']:.1f}% at "
            f"k={large_k:g} (mean of {n}; linear best in {wins} of {len(per_seed)} seeds); paper "
            f"{p['linear']:.2f}, {p['sqrt']:.2f}, {p['none']:.2f}",
            paper=f"{src}: linear {p['linear']:.2f}%, sqrt {p['sqrt']:.2f}%, none "
            f"{p['none']:.2f}% error ({big})",
            budget=b,
        ),
        studies.finding(
            f"without scaling the large minibatch collapses: over {COLLAPSE_PCT:g} points worse "
            f"than the linear rule",
            # the claim is that "none" fails: it is not held to training
            studies.worse_by(
                e["none"], e["linear"], COLLAPSE_PCT, chance=chance, paired=True, may_fail="x"
            ),
            f"none {m['none']:.1f}% vs linear {m['linear']:.1f}% "
            f"({m['none'] - m['linear']:+.1f} points, mean of {n}); paper {p['none']:.2f} vs "
            f"{p['linear']:.2f} ({p['none'] - p['linear']:+.1f})",
            paper=f"{src}: none {p['none']:.2f}% vs linear {p['linear']:.2f}% error "
            f"({p['none'] - p['linear']:+.2f} points, {big})",
            budget=b,
        ),
    ]
