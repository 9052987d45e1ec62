"""7. No weight decay on BN and biases (Jia et al. 2018): the profile's ResNet with LARS (the keys
of notebook 6) at the largest LARS k, with ``decay_bn_bias`` true and false, paired by seed.

One thing changes, the decay, as on Jia et al.'s slide: both arms keep BN and biases in LARS's
trust ratio (``adapt_bn_bias=true``; without it ``decay_bn_bias=false`` would also move them to the
raw global lr, notebook 6's LARS runs). Jia et al. report accuracy; the table gives error = 100 −
accuracy. A diverged run counts as 100% error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import lars
from lbsgd.lab.studies.scales import Profile

STUDY = "bn_decay"
TITLE = "7. No weight decay on BN and biases (Jia et al. 2018)"
LABELS = {True: "decay on BN and bias", False: "no decay on BN and bias"}


def runs(
    profile: Profile,
    seeds: Sequence[int],
    ks: Sequence[float] | None = None,
    *,
    lars_base_lr: float | None = None,
    epochs: float | None = None,
) -> list[dict[str, Any]]:
    """LARS at the largest k (of ``ks``, else the profile's LARS list) with and without weight
    decay on BN γ/β and biases, both arms adapting them, every seed: the decayed arm adapts them
    by default (``adapt_bn_bias`` null: as ``decay_bn_bias``, the runs made before the key), the
    other says ``adapt_bn_bias=true``."""
    kmax = max(ks or profile.ks["lars"])
    keys = lars.lars_keys(profile, lars_base_lr=lars_base_lr, epochs=epochs)
    adapted = {True: {}, False: {"adapt_bn_bias": True}}
    return [
        profile.keys(k=kmax, **{**keys, "decay_bn_bias": d, **adapted[d], "seed": s})
        for d in (True, False)
        for s in seeds
    ]


prepare = lars.prepare  # diverged runs at 100% error, and the network family (``arch``)


def paper():
    """Jia et al.'s rows: network, whether BN (and bias) was decayed, accuracy and error."""
    p = ex.reference(STUDY)
    p["arch"] = [lars.arch(m) for m in p["model"]]
    p["decay_bn_bias"] = ~p["variant"].str.startswith("no ")
    p["paper_top1_error_pct"] = 100 - p["value"]  # Jia et al. give accuracy
    return p[["arch", "decay_bn_bias", "batch", "value", "paper_top1_error_pct", "variant"]].rename(
        columns={"batch": "paper_batch", "value": "paper_top1_acc_pct", "variant": "paper_variant"}
    )


def table(df):
    """Ours beside Jia et al.'s ResNet-50 rows, with decay first (the paper's order)."""
    df = prepare(df)
    by = ["arch", "optimizer", "k", "batch_size", "decay_bn_bias"]
    ours = studies.summary(df, by)
    p = paper()
    t = ours.merge(p[p["arch"] == "resnet"], on=["arch", "decay_bn_bias"], how="left")
    t = t.sort_values("decay_bn_bias", ascending=False).reset_index(drop=True)
    return t.astype({c: "Int64" for c in t if c in studies.INT_COLUMNS})


def findings(df) -> list[Finding]:
    """No decay on BN and biases beats decaying them (LARS at the largest k; paired over seeds)."""
    df = prepare(df)
    k = float(df["k"].max())
    df = df[df["k"] == k]
    no, yes = (studies.errors(df, decay_bn_bias=d) for d in (False, True))
    w, n = studies.wins(df, "decay_bn_bias", False, True)
    p = paper().set_index(["arch", "decay_bn_bias"])["paper_top1_acc_pct"]
    raw = ex.reference(STUDY)
    src, big = studies.cite(*raw["source"]), studies.kilo(raw["batch"].max())
    finding = studies.finding(
        "with LARS at the largest minibatch, no weight decay on BN and biases beats decaying them "
        "(ResNet; both arms keep them in the trust ratio)",
        studies.lower(no, yes, chance=studies.chance_of(df), paired=True),
        f"k={k:g}: no decay {studies.mean(no):.1f}% vs decay {studies.mean(yes):.1f}% error "
        f"(mean of {n}; no decay better in {w} of {n} seeds); Jia et al. accuracy: ResNet-50 "
        f"{p['resnet', True]:.1f} to {p['resnet', False]:.1f} (error {100 - p['resnet', True]:.1f} "
        f"to {100 - p['resnet', False]:.1f}), AlexNet {p['alexnet', True]:.1f} to "
        f"{p['alexnet', False]:.1f}",
        paper=f"{src}: accuracy with vs without weight decay: ResNet-50 (on BN) "
        f"{p['resnet', True]:.1f}% vs {p['resnet', False]:.1f}%, AlexNet (on bias and BN) "
        f"{p['alexnet', True]:.1f}% vs {p['alexnet', False]:.1f}% ({big}, LARS)",
        budget=studies.budget(df, [k]),
    )
    return [finding]
