"""5. BN γ initialisation (Goyal et al. 2017, Table 2b): γ = 1 and γ = 0 in the last BN of each
residual block (``zero_init_residual`` false / true) at k = 1 without warmup and at the large k
with gradual warmup, over the profile's seeds, paired by seed; on the smoke and cpu profiles a
deeper ResNet (the probe) trains one more pair at the large k, first seed only.

The γ = 1 runs are the baseline and gradual-warmup runs of study 2 (copied when it ran first). A
diverged run counts as 100% error. Each run's ``plateau_epochs`` (the epochs until the smoothed
training loss has made half of its decrease) explains a reversed order: with a shallow ResNet,
γ = 0 can lengthen the initial plateau.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import Metrics, at_chance, curves, mean, note
from lbsgd.lab.studies.scales import Profile

STUDY = "bn_gamma_init"
TITLE = "5. BN γ initialisation (Goyal Table 2b)"
PROBE_PROFILES = ("smoke", "cpu")  # the scales whose ResNet-8 is shallow enough to need the probe


def runs(
    profile: Profile,
    seeds: Sequence[int],
    ks: Sequence[float] | None = None,
    *,
    probe_depth: int = 14,
) -> list[dict[str, Any]]:
    """γ = 1 and γ = 0 at the baseline (first of ``ks``, default k = 1) without warmup and at the
    large k (last of ``ks``, default ``large_k``), every seed; then, on the smoke and cpu
    profiles' ResNet, the pair at depth ``probe_depth`` at the large k, first seed (0: none)."""
    k = list(ks or [1, profile.large_k])
    base_k, large_k = k[0], k[-1]
    out = [
        profile.keys(k=base_k, warmup="none", zero_init_residual=z, seed=s)
        for z in (False, True)
        for s in seeds
    ]
    out += [
        profile.keys(k=large_k, zero_init_residual=z, seed=s) for z in (False, True) for s in seeds
    ]
    if probe_depth and profile.name in PROBE_PROFILES and profile.base.get("model") == "resnet":
        out += [
            profile.keys(k=large_k, depth=probe_depth, zero_init_residual=z, seed=seeds[0])
            for z in (False, True)
        ]
    return out


def plateau_epochs(train) -> float:
    """Epochs until the training loss, smoothed over 5% of the steps, has made half of its decrease
    from its start to its lowest (NaN when it never does, e.g. a diverged run)."""
    loss = train["loss"].astype(float).rolling(max(1, len(train) // 20), min_periods=1).mean()
    hit = train["epoch"][loss <= (loss.iloc[0] + loss.min()) / 2]
    return float(hit.iloc[0]) if len(hit) else math.nan


def prepare(df, metrics: Metrics = None):
    """The runs as the study reads them: diverged runs at 100% error, ``arch`` (resnet<depth>),
    ``gamma_init`` (0 or 1) and ``plateau_epochs`` (from ``metrics``, a mapping run_dir → training
    records or a loader; None reads the run directories; kept when ``df`` has it already)."""
    out = studies.diverged_as_failed(df)
    out["arch"] = [
        f"resnet{d}" if m == "resnet" else m
        for m, d in zip(out["model"], out["depth"], strict=True)
    ]
    out["gamma_init"] = out["zero_init_residual"].map({True: 0, False: 1})
    if "plateau_epochs" not in df:
        load = curves(metrics)
        out["plateau_epochs"] = [plateau_epochs(load(d)) for d in out["run_dir"]]
    return out


def main_arch(df) -> str:
    """The profile's network: the one trained at the baseline k (the probe only at the large k)."""
    return str(df[df["k"] == df["k"].min()]["arch"].iloc[0])


def paper(base_k: float, large_k: float, arch: str):
    """Table 2b's rows at the baseline and the large k, on the rows of the network ``arch``."""
    p = ex.reference(STUDY)
    p["k"] = [base_k if b == 256 else large_k for b in p["batch"]]
    p["gamma_init"] = [0 if v.startswith("gamma=0") else 1 for v in p["variant"]]
    p["arch"] = arch
    return p[["arch", "k", "gamma_init", "batch", "value", "std"]].rename(
        columns={"batch": "paper_batch", "value": "paper_top1_error_pct", "std": "paper_std"}
    )


def table(df, metrics: Metrics = None):
    """Mean error, plateau length and diverged runs per network, k and γ, beside Table 2b; the
    profile's network first."""
    df = prepare(df, metrics)
    main = main_arch(df)
    by = ["arch", "k", "batch_size", "warmup", "gamma_init"]
    ours = ex.summarize(df, by)
    ours = ours.merge(ex.summarize(df, by, "plateau_epochs")[[*by, "plateau_epochs_mean"]], on=by)
    ours = ours.merge(df.groupby(by)["diverged"].sum().astype(int).reset_index(), on=by)
    t = ours.merge(
        paper(df["k"].min(), df["k"].max(), main), on=["arch", "k", "gamma_init"], how="left"
    )
    t = t.sort_values(
        ["arch", "k", "gamma_init"], key=lambda c: c != main if c.name == "arch" else c
    )
    t = studies.k_as_paper_batch(t.reset_index(drop=True))
    return t.astype({c: "Int64" for c in t if c in studies.INT_COLUMNS})


def _paired(df, arch: str, k: float):
    """Per seed (rows) the error with γ = 0 and γ = 1 (columns), of the seeds both ran."""
    sel = df[(df["arch"] == arch) & (df["k"] == k)]
    return sel.pivot_table(
        index="seed", columns="gamma_init", values="final_top1_error_pct"
    ).dropna()


def _plateau(df, arch: str, k: float, g: int) -> float:
    sel = df[(df["arch"] == arch) & (df["k"] == k) & (df["gamma_init"] == g)]
    return float(sel["plateau_epochs"].mean())


def findings(df, metrics: Metrics = None) -> list[Finding]:
    """γ = 0 beats γ = 1 at the baseline k and at the large k (decided over the paired seeds, the
    evidence counting the seeds γ = 0 wins), and with the deeper probe (its seeds paired; one
    seed alone has no interval). The large k's claims carry their budget."""
    df = prepare(df, metrics)
    chance, main = studies.chance_of(df), main_arch(df)
    base_k, large_k = float(df["k"].min()), float(df["k"].max())
    # the paper's errors by (k, γ), and its words for each k
    p = paper(base_k, large_k, main).set_index(["k", "gamma_init"])["paper_top1_error_pct"]
    raw = ex.reference(STUDY)
    src = studies.cite(*raw["source"])
    quote = {
        k: f"{src}: γ=0 {p[k, 0]:.2f}% vs γ=1 {p[k, 1]:.2f}% error ({studies.kilo(b)})"
        for k, b in ((base_k, raw["batch"].min()), (large_k, raw["batch"].max()))
    }
    budget = {a: studies.budget(df[df["arch"] == a], [large_k]) for a in set(df["arch"])}
    out = [
        _zero_gamma_wins(df, main, k, where, chance, p, quote[k], b)
        for k, where, b in (
            (base_k, f"at k={base_k:g} (no warmup)", None),
            (large_k, f"at the large minibatch k={large_k:g}", budget[main]),
        )
    ]
    return out + [
        _deeper_probe(df, arch, large_k, chance, p, quote[large_k], budget[arch])
        for arch in sorted(set(df["arch"]) - {main})
    ]


def _zero_gamma_wins(df, main: str, k: float, where: str, chance, p, quote: str, b) -> Finding:
    """γ = 0 beats γ = 1 with the profile's network ``main`` at ``k`` (paired over seeds)."""
    piv = _paired(df, main, k)
    e0, e1 = list(piv[0]), list(piv[1])
    w, n = int((piv[0] < piv[1]).sum()), len(piv)
    verdict = studies.lower(e0, e1, chance=chance, paired=True)
    return studies.finding(
        f"γ=0 in the last BN of each residual block beats γ=1 {where}",
        verdict,
        f"γ=0 {mean(e0):.1f}% vs γ=1 {mean(e1):.1f}% (mean of {n}; γ=0 better in {w} of {n} "
        f"seeds; paper {p[k, 0]:.2f} vs {p[k, 1]:.2f})"
        + note(
            verdict,
            not mean(e0) < mean(e1) and not at_chance([*e0, *e1], chance),
            f"an earlier ResNet-8 probe found the order reversed, γ=0 (every block of a "
            f"shallow net starting as the identity) lengthening the initial plateau; here the "
            f"training loss made half of its decrease after {_plateau(df, main, k, 0):.2f} "
            f"epochs with γ=0 vs {_plateau(df, main, k, 1):.2f} with γ=1",
        ),
        paper=quote,
        budget=b,
    )


def _deeper_probe(df, arch: str, large_k: float, chance, p, quote: str, b) -> Finding:
    """γ = 0 beats γ = 1 with the deeper probe ``arch`` at the large k (paired over its seeds)."""
    piv = _paired(df, arch, large_k)
    e0, e1 = list(piv[0]), list(piv[1])
    seeds = f"mean of {len(piv)}" if len(piv) > 1 else f"seed {piv.index[0]} only"
    return studies.finding(
        f"with a deeper ResNet ({arch}, the probe) γ=0 beats γ=1 at the large minibatch",
        studies.lower(e0, e1, chance=chance, paired=True),
        f"γ=0 {mean(e0):.1f}% vs γ=1 {mean(e1):.1f}% ({seeds}; half the loss decrease after "
        f"{_plateau(df, arch, large_k, 0):.2f} vs {_plateau(df, arch, large_k, 1):.2f} epochs); "
        f"paper, ResNet-50: {p[large_k, 0]:.2f} vs {p[large_k, 1]:.2f}",
        paper=quote.replace(":", " (ResNet-50):", 1),
        budget=b,
    )
