"""8. BN after pool5 in AlexNet (Jia et al. 2018): plain AlexNet with LARS (the keys of notebook 6)
at the AlexNet k, in the three of Jia et al.'s five settings that map onto lbsgd keys, paired by seed.

``decay_bn_bias`` switches the decay of biases and of BN γ/β together, and plain AlexNet has BN
only when ``pool5_bn`` adds one: the rows (decay bias, not BN) and (decay BN, not bias) have no
keys. Jia et al. report accuracy; the table gives error = 100 − accuracy. A diverged run counts as
100% error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import lars
from lbsgd.lab.studies.scales import Profile

STUDY = "pool5_bn"
TITLE = "8. BN after pool5 in AlexNet (Jia et al. 2018)"
SETTINGS = ((True, False), (False, False), (False, True))  # (decay_bn_bias, pool5_bn) replayed
KEYS = ["decay_bias", "decay_bn", "pool5_bn"]  # the paper's switches
PAPER_NAMES = ("decay bias", "decay BN", "pool5-BN")


def runs(
    profile: Profile,
    seeds: Sequence[int],
    ks: Sequence[float] | None = None,
    *,
    lars_base_lr: float | None = None,
    epochs: float | None = None,
) -> list[dict[str, Any]]:
    """Plain AlexNet with LARS at ``max(ks)`` (else the profile's AlexNet k) in each setting of
    :data:`SETTINGS`, every seed."""
    k = max(ks) if ks else profile.alexnet_k()
    keys = lars.lars_keys(profile, alexnet=True, lars_base_lr=lars_base_lr, epochs=epochs)
    alex = lars.own(lars.settings(profile, "alexnet"), epochs)
    return [
        profile.keys(
            k=k,
            **{**alex, "model": "alexnet", **keys, "decay_bn_bias": d, "pool5_bn": b, "seed": s},
        )
        for d, b in SETTINGS
        for s in seeds
    ]


def prepare(df):
    """Diverged runs at 100% error; the paper's switches (biases and BN decay together here)."""
    df = studies.diverged_as_failed(df)
    df["decay_bias"] = df["decay_bn_bias"]
    df["decay_bn"] = df["decay_bn_bias"]
    return df


def paper():
    """Jia et al.'s five AlexNet rows, in their order (``paper_row``), with their switches."""
    p = ex.reference(STUDY)
    flags = [dict(re.findall(r"(decay bias|decay BN|pool5-BN)=(yes|no)", v)) for v in p["variant"]]
    for col, name in zip(KEYS, PAPER_NAMES, strict=True):
        p[col] = [f[name] == "yes" for f in flags]
    p["paper_top1_error_pct"] = 100 - p["value"]  # Jia et al. give accuracy
    p["paper_row"] = range(1, len(p) + 1)  # the order of Jia et al.'s table
    return p[["paper_row", *KEYS, "batch", "value", "paper_top1_error_pct"]].rename(
        columns={"batch": "paper_batch", "value": "paper_top1_acc_pct"}
    )


def table(df):
    """Jia et al.'s rows in their order, ours beside the three replayed, and for the other two
    why they are not replayed (``replayed_here``)."""
    import pandas as pd

    df = prepare(df)
    by = ["k", "batch_size", "decay_bn_bias", *KEYS]
    ours = studies.summary(df, by)
    ours["note"] = [
        "the BN after pool5 is the only BN"
        if b
        else "plain AlexNet has no BN: only the biases are switched"
        for b in ours["pool5_bn"]
    ]
    t = ours.merge(paper(), on=KEYS, how="outer")

    def same_network(r) -> int:
        # the replayed row that trains the same plain AlexNet (no BN to decay without pool5-BN)
        hit = t[
            t["runs"].notna()
            & (t["decay_bias"] == r["decay_bias"])
            & (t["pool5_bn"] == r["pool5_bn"])
        ]
        return int(hit["paper_row"].iloc[0])

    t["replayed_here"] = [
        "yes"
        if pd.notna(r["runs"])
        else (
            "no: decay_bn_bias switches bias and BN decay together (without pool5-BN plain AlexNet "
            f"has no BN, so the network and keys would be those of row {same_network(r)})"
        )
        for _, r in t.iterrows()
    ]
    t = t.sort_values("paper_row").reset_index(drop=True)
    return t.astype({c: "Int64" for c in t if c in studies.INT_COLUMNS})


def findings(df) -> list[Finding]:
    """pool5-BN's error below none's (no decay on bias and BN; paired over seeds). Jia et al.'s
    no-decay result is a claim about their AlexNet with BN (it decays BN γ/β): plain AlexNet has
    no BN, so that claim is not made here (the table keeps the decayed row beside theirs)."""
    df = prepare(df)
    k, raw, p = float(df["k"].max()), ex.reference(STUDY), paper()
    src, big = studies.cite(*raw["source"]), studies.kilo(raw["batch"].max())
    bn, none = (studies.errors(df, decay_bn_bias=False, pool5_bn=b) for b in (True, False))
    w, n = studies.wins(df, ["decay_bn_bias", "pool5_bn"], (False, True), (False, False))
    # Jia et al.'s accuracy without decay, by pool5-BN
    acc = p[~p["decay_bias"] & ~p["decay_bn"]].set_index("pool5_bn")["paper_top1_acc_pct"]
    off, on = float(acc[False]), float(acc[True])
    return [
        studies.finding(
            "BN after pool5 improves AlexNet over no pool5-BN (no decay on bias and BN)",
            studies.lower(bn, none, chance=studies.chance_of(df), paired=True),
            f"k={k:g}: pool5-BN {studies.mean(bn):.1f}% vs none {studies.mean(none):.1f}% error "
            f"(mean of {n}; pool5-BN better in {w} of {n} seeds); Jia et al. accuracy "
            f"{off:.1f} to {on:.1f} (error {100 - off:.1f} to {100 - on:.1f})",
            paper=f"{src}: AlexNet accuracy {off:.1f}% without vs {on:.1f}% with BN after pool5 "
            f"(no decay on bias and BN; {big}, LARS)",
            budget=studies.budget(df, [k]),
        )
    ]
