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
from dataclasses import dataclass
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
    ours = ex.summarize(df, by).merge(
        df.groupby(by)["diverged"].sum().astype(int).reset_index(), on=by
    )
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
    return t.astype({c: "Int64" for c in t if c in lars.INT_COLUMNS})


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _paper_acc(d: bool, b: bool) -> float:
    p = paper()
    r = p[(p["decay_bias"] == d) & (p["decay_bn"] == d) & (p["pool5_bn"] == b)]
    return float(r["paper_top1_acc_pct"].iloc[0])


def _wins(df, better: tuple[bool, bool], worse: tuple[bool, bool]) -> tuple[int, int]:
    """Seeds where setting ``better`` (decay_bn_bias, pool5_bn) has the lower error, of those
    both ran."""
    piv = df.pivot_table(
        index="seed", columns=["decay_bn_bias", "pool5_bn"], values="final_top1_error_pct"
    )
    if better not in piv or worse not in piv:
        return 0, 0
    pair = piv[[better, worse]].dropna()
    return int((pair[better] < pair[worse]).sum()), len(pair)


def findings(df) -> list[Finding]:
    """pool5-BN beats none (no decay), decided over seeds. Jia et al.'s no-decay result is a
    claim about their AlexNet with BN (it decays BN γ/β): plain AlexNet has no BN, so that claim
    is not made here (the table keeps the decayed row beside theirs)."""
    df = prepare(df)
    s = _settings(df)
    return [_pool5_bn_helps(df, s)]


@dataclass(frozen=True)
class _Settings:
    """What the claims read: the chance error, the k, the errors by seed of each setting
    ((decay_bn_bias, pool5_bn)); the paper's source and batch."""

    chance: float | None
    k: float
    err: dict[tuple[bool, bool], list[float]]
    src: str
    big: str


def _settings(df) -> _Settings:
    raw = ex.reference(STUDY)
    return _Settings(
        chance=studies.chance_of(df),
        k=float(df["k"].max()),
        err={s: studies.errors(df, decay_bn_bias=s[0], pool5_bn=s[1]) for s in SETTINGS},
        src=studies.cite(*raw["source"]),
        big=studies.kilo(raw["batch"].max()),
    )


def _pool5_bn_helps(df, s: _Settings) -> Finding:
    """pool5-BN's error below none's (no decay; paired over seeds)."""
    bn, none = s.err[False, True], s.err[False, False]
    w_bn, n_bn = _wins(df, (False, True), (False, False))
    return studies.finding(
        "BN after pool5 improves AlexNet over no pool5-BN (no decay on bias and BN)",
        studies.lower(bn, none, chance=s.chance, paired=True),
        f"k={s.k:g}: pool5-BN {_mean(bn):.1f}% vs none {_mean(none):.1f}% error (mean of {n_bn}; "
        f"pool5-BN better in {w_bn} of {n_bn} seeds); Jia et al. accuracy "
        f"{_paper_acc(False, False):.1f} to {_paper_acc(False, True):.1f} (error "
        f"{100 - _paper_acc(False, False):.1f} to {100 - _paper_acc(False, True):.1f})",
        paper=f"{s.src}: AlexNet accuracy {_paper_acc(False, False):.1f}% without vs "
        f"{_paper_acc(False, True):.1f}% with BN after pool5 (no decay on bias and BN; {s.big}, "
        "LARS)",
        budget=studies.budget(df, [s.k]),
    )
