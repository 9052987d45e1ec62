"""2. Warmup (Goyal et al. 2017, Table 1 and Figure 2): the baseline (k = 1, no warmup) and the
large minibatch with no, constant and gradual warmup, over the profile's seeds (paired: seed s gives
the same initialisation at every k)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lbsgd.lab import experiments as ex
from lbsgd.lab import findings as fs
from lbsgd.lab import stats, studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import Metrics, Verdict, at_chance, curves, every, mean, note
from lbsgd.lab.studies.scales import Profile

STUDY = "warmup"
TITLE = "2. Warmup (Goyal Table 1)"
WARMUPS = ("none", "constant", "gradual")
# "comes close to the baseline", an equivalence margin in points of top-1 error: Goyal's gradual
# 8k run is +0.14 above his baseline (seed sd 0.09-0.12), his no-warmup run +1.24 and his 16k run
# +1.19 (Table 1, Fig. 1): ±1.0 holds the first and rejects both contrasting arms.
CLOSE_PCT = 1.0
SPIKE = 1.1  # a jump ratio below this barely disturbs training
# Goyal et al. train on k GPUs of n = 32 images each (minibatch kn): Table 1's k = 8 (256) and
# k = 256 (8k) are GPUs, shown as paper_gpus; lbsgd's k is the minibatch over the reference batch.
PAPER_IMAGES_PER_GPU = 32
# Goyal §5.2, Figs. 2 and 4: the large minibatch's training curve against the small one's, both
# read per epoch. A pair of runs (one seed, the same initialisation) is compared by its loss gap
# (:func:`loss_gap_pct`) over a window of epochs.
CURVE_BINS = 32  # bins of equal epochs over the whole training (1/8 epoch each at 4 epochs)
# "early": the two epochs after the warmup ends (not the warmup itself, where gradual warmup runs a
# lower lr by design), at most to mid-training
EARLY_EPOCHS = 2.0
MATCH_PCT = 10.0  # "matches": the loss gap over the second half of training within ±10%

# -- the runs and the table --------------------------------------------------------------------


def runs(
    profile: Profile, seeds: Sequence[int], ks: Sequence[float] | None = None
) -> list[dict[str, Any]]:
    """The baseline (first of ``ks``, default k = 1) without warmup, then the large minibatch (last
    of ``ks``, default the profile's ``large_k``) with each warmup; every seed."""
    k = list(ks or [1, profile.large_k])
    base_k, large_k = k[0], k[-1]
    out = [profile.keys(k=base_k, warmup="none", seed=s) for s in seeds]
    out += [profile.keys(k=large_k, warmup=w, seed=s) for w in WARMUPS for s in seeds]
    return out


def table(df):
    """Mean error per k and warmup, beside Table 1 (the paper's 256 row at the baseline's k, its
    8k rows at the large k; ``paper_gpus``: the paper's k, its GPUs)."""
    base_k, large_k = float(df["k"].min()), float(df["k"].max())
    ours = ex.summarize(df, ["k", "batch_size", "warmup"])
    paper = ex.reference(STUDY)[["batch", "warmup", "value", "std", "variant"]]
    names = {c: f"paper_{c}" for c in ("batch", "std", "variant")}
    paper = paper.rename(columns=names | {"value": "paper_top1_error_pct"})
    paper["k"] = [base_k if b == 256 else large_k for b in paper["paper_batch"]]
    paper["paper_gpus"] = paper["paper_batch"] // PAPER_IMAGES_PER_GPU
    cols = ["k", "warmup", "paper_top1_error_pct", "paper_std", "paper_variant", "paper_batch"]
    t = ours.merge(paper[[*cols, "paper_gpus"]], on=["k", "warmup"], how="left")
    t = studies.k_as_paper_batch(t)
    return t.astype({"paper_batch": "Int64", "paper_gpus": "Int64"})  # no 8.2e+03


def above_baseline(t):
    """Per warmup at the large k (rows of :func:`table`): our mean top-1 error above our
    baseline's, its seed spread, and the paper's above its baseline (Goyal Table 1, 8k against
    256), in points: the one quantity that compares across the scales."""
    import pandas as pd

    base = t[t["k"] == t["k"].min()].iloc[0]
    big = t[t["k"] == t["k"].max()].set_index("warmup").reindex(list(WARMUPS))
    ours, paper = "final_top1_error_pct_mean", "paper_top1_error_pct"
    return pd.DataFrame(
        {
            "warmup": list(WARMUPS),
            "ours": (big[ours] - base[ours]).to_numpy(),
            "ours_std": big["final_top1_error_pct_std"].to_numpy(),
            "paper": (big[paper] - base[paper]).to_numpy(),
        }
    )


# -- the findings ------------------------------------------------------------------------------


def _train(records):
    """The training records of a run's metrics (those of kind train where they carry a kind)."""
    return records[records["kind"] == "train"] if "kind" in records else records


def jump_ratio(train) -> float:
    """The constant warmup's jump to kη: the highest training loss in the 5% of steps after the
    last rise of the lr over the mean loss of the 5% before (Goyal Fig. 2b: a spike, above 1);
    NaN when the lr never rises."""
    train = _train(train).reset_index(drop=True)
    rises = (train["lr"].diff() > 0).to_numpy().nonzero()[0]
    if len(rises) == 0:
        return math.nan
    at, w = int(rises[-1]), max(1, len(train) // 20)
    loss = train["loss"].astype(float)
    return float(loss.iloc[at : at + w].max() / loss.iloc[max(0, at - w) : at].mean())


def findings(df, metrics: Metrics = None) -> list[Finding]:
    """Gradual beats none; constant is the worst of the three; gradual comes within
    :data:`CLOSE_PCT` of the baseline (equivalence). Decided over seeds, paired
    (:mod:`lbsgd.lab.studies`); each carries the arms' optimizer steps (its budget); ``metrics`` gives
    the constant runs' training curves (read only to explain a claim not shown)."""
    df = studies.diverged_as_failed(df)
    chance, base_k, large_k = studies.chance_of(df), float(df["k"].min()), float(df["k"].max())
    e = {w: studies.errors(df, k=large_k, warmup=w) for w in WARMUPS}
    m, n = {w: mean(v) for w, v in e.items()}, len(e["gradual"])
    base = studies.errors(df, k=base_k)
    p, p_base, src, table_batch = _table1()
    big, ours = studies.kilo(table_batch), studies.paper_batch(large_k)
    mapped = ""  # where k does not stand for Table 1's batch, the evidence says so
    if ours != table_batch:
        mapped = f"; k={large_k:g} is {studies.kilo(ours)} by k · 256, Table 1 reports {big} only"
    v_constant = every(
        studies.worse_by(e["constant"], e["none"], 0.0, chance=chance, paired=True),
        studies.worse_by(e["constant"], e["gradual"], 0.0, chance=chance, paired=True),
    )
    v_close = studies.within(e["gradual"], base, CLOSE_PCT, chance=chance, paired=True)
    steps = {k: int(df[df["k"] == k]["total_steps"].iloc[0]) for k in (base_k, large_k)}
    against = not abs(m["gradual"] - mean(base)) < CLOSE_PCT and not at_chance(
        [*e["gradual"], *base], chance
    )
    why_close = note(
        v_close,
        against,
        f"the large minibatch gets {steps[large_k]} optimizer steps here (the baseline "
        f"{steps[base_k]}), and at this budget the error starts to rise by k={large_k:g} "
        "(notebook 03), where Goyal's curve is still flat",
    )
    b = studies.budget(df, [base_k, large_k])
    return [
        studies.finding(
            "gradual warmup beats no warmup at the large minibatch",
            studies.lower(e["gradual"], e["none"], chance=chance, paired=True),
            f"{m['gradual']:.1f}% vs {m['none']:.1f}% (mean of {n}; paper {p['gradual']:.2f} vs "
            f"{p['none']:.2f}{mapped})",
            paper=f"{src}: gradual {p['gradual']:.2f}% vs none {p['none']:.2f}% error ({big})",
            budget=b,
        ),
        studies.finding(
            "constant warmup is the worst of the three",
            v_constant,
            f"constant {m['constant']:.1f}%, none {m['none']:.1f}%, gradual {m['gradual']:.1f}% "
            f"(paper {p['constant']:.2f} worst)"
            + _why_constant(df, v_constant, e, chance, metrics),
            paper=f"{src}: constant {p['constant']:.2f}%, none {p['none']:.2f}%, gradual "
            f"{p['gradual']:.2f}% error ({big})",
            budget=b,
        ),
        studies.finding(
            f"with gradual warmup the large minibatch comes close to the baseline (within "
            f"±{CLOSE_PCT:g} point, a margin that rejects Goyal's no-warmup run at +1.24)",
            v_close,
            f"{m['gradual']:.1f}% vs baseline {mean(base):.1f}% (paper {p['gradual']:.2f} vs "
            f"{p_base:.2f}{mapped})" + why_close,
            paper=f"{src}: gradual {p['gradual']:.2f}% error at {big} vs baseline {p_base:.2f}% "
            "at 256",
            budget=b,
        ),
    ]


def _table1() -> tuple[dict[str, float], float, str, int]:
    """Goyal's Table 1: the top-1 error by warmup at its large batch, the baseline's at 256, their
    citation, and the large batch."""
    ref = ex.reference(STUDY)
    large = ref["batch"] > 256
    p = dict(zip(ref["warmup"][large], ref["value"][large], strict=True))
    p_base = float(ref["value"][ref["batch"] == 256].iloc[0])
    return p, p_base, studies.cite(*ref["source"]), int(ref["batch"].max())


def _why_constant(df, v: Verdict, e: dict[str, list[float]], chance, metrics: Metrics) -> str:
    """Where the means do not show constant warmup the worst, what the constant runs' training
    curves say: how far the loss jumps when the warmup ends ("" where they show it)."""
    m = {w: mean(x) for w, x in e.items()}
    if v.replayed is True or m["constant"] > max(m["none"], m["gradual"]):
        return ""
    const = df[(df["k"] == df["k"].max()) & (df["warmup"] == "constant")]
    spike = mean([jump_ratio(curves(metrics)(d)) for d in const["run_dir"]])
    shown = not at_chance([x for w in e.values() for x in w], chance)
    return note(
        v,
        shown,
        (
            f"the jump at the end of the constant warmup barely disturbs training here (the "
            f"loss after the jump peaks at {spike:.2f}x its mean just before, mean of "
            f"{len(const)}), so the low-lr phase only costs steps"
            if spike < SPIKE
            else f"the jump at the end of the constant warmup raises the loss (its peak after "
            f"the jump is {spike:.2f}x the mean just before, mean of {len(const)}) but the "
            f"remaining steps recover from it"
        )
        + ("; constant is still worse than gradual" if m["constant"] > m["gradual"] else ""),
    )


# -- the training curves (Goyal Figs. 2 and 4) -------------------------------------------------


def binned_loss(train, edges: np.ndarray) -> np.ndarray:
    """The mean training loss of the steps whose epoch (at the step's end) falls in each bin
    ``(edges[i], edges[i + 1]]``; NaN for a bin without a step."""
    train = _train(train)
    epoch = train["epoch"].to_numpy(dtype=float)
    loss = train["loss"].to_numpy(dtype=float)
    which = np.digitize(epoch, edges, right=True) - 1  # bin i holds edges[i] < epoch <= edges[i+1]
    out = np.full(len(edges) - 1, np.nan)
    for i in range(len(out)):
        inside = loss[which == i]
        if len(inside):
            out[i] = inside.mean()
    return out


def loss_gap_pct(small, large, start: float, end: float, bins: int = CURVE_BINS) -> float:
    """How far the large minibatch's training loss lies above the small minibatch's (%; negative:
    below) over the epochs ``[start, end]``: each run's loss averaged in ``bins`` bins of equal
    epochs over the whole training (both runs' last epoch), the relative gap taken bin by bin, and
    its mean over the bins inside the window in which both runs logged a step (NaN if none)."""
    total = max(float(small["epoch"].max()), float(large["epoch"].max()))
    edges = np.linspace(0.0, total, bins + 1)
    a, b = binned_loss(small, edges), binned_loss(large, edges)
    inside = (edges[:-1] >= start - 1e-9) & (edges[1:] <= end + 1e-9)
    gaps = ((b - a) / a * 100.0)[inside & np.isfinite(a) & np.isfinite(b)]
    return float(gaps.mean()) if len(gaps) else math.nan


def early_window(df) -> tuple[float, float]:
    """The epochs of "early" that :func:`loss_gap_pct` reads: the whole bins (of
    :data:`CURVE_BINS` over the runs' last epoch) from the end of the large minibatch's gradual
    warmup (``warmup_epochs``), :data:`EARLY_EPOCHS` on, at most to mid-training (``fashion-long``:
    0.5-2.25 of 0.45-2.45)."""
    start = float(df[df["k"] == df["k"].max()]["warmup_epochs"].iloc[0])
    epochs = float(df["epochs"].max())
    end, width = min(start + EARLY_EPOCHS, epochs / 2), epochs / CURVE_BINS
    return math.ceil(start / width - 1e-9) * width, math.floor(end / width + 1e-9) * width


def curve_gaps(df, metrics: Metrics = None) -> dict[str, dict[str, list[float]]]:
    """Per large-minibatch warmup, the per-seed loss gaps to the baseline run of the same seed:
    ``early`` over :func:`early_window`, ``late`` over the second half of training."""
    load = curves(metrics)
    base_k, large_k = float(df["k"].min()), float(df["k"].max())
    base = {int(r["seed"]): load(r["run_dir"]) for _, r in df[df["k"] == base_k].iterrows()}
    start, end = early_window(df)
    out: dict[str, dict[str, list[float]]] = {}
    for w in WARMUPS:
        arm = df[(df["k"] == large_k) & (df["warmup"] == w)].sort_values("seed")
        early, late = [], []
        for _, r in arm.iterrows():
            small, large = base[int(r["seed"])], load(r["run_dir"])
            total = float(large["epoch"].max())
            early.append(loss_gap_pct(small, large, start, end))
            late.append(loss_gap_pct(small, large, total / 2, total))
        out[w] = {"early": early, "late": late}
    return out


def curve_findings(df, metrics: Metrics = None) -> list[Finding]:
    """Goyal §5.2: with gradual warmup the large minibatch's training curve matches the small
    one's after the first epochs (equivalence within ±:data:`MATCH_PCT`, and closer than without
    warmup: a margin the contrasting arm must fail); without warmup it lags the gradual-warmup run
    early, over the epochs after the warmup (Fig. 2a: no warmup against gradual). Decided from the
    per-seed loss gaps (:func:`curve_gaps`), each seed's gap a paired difference against its own
    baseline. Where no warmup's own late gap lies inside ±MATCH_PCT, the margin alone would pass
    both arms: the evidence says that the first claim rests on its paired conjunct."""
    g = curve_gaps(df, metrics)
    b = studies.budget(df, [float(df["k"].min()), float(df["k"].max())])
    n, unit = len(g["gradual"]["late"]), "% of the loss"
    alone = ""
    if g["none"]["late"] and abs(mean(g["none"]["late"])) < MATCH_PCT:
        alone = (
            f"; no warmup's gap also lies inside ±{MATCH_PCT:g}%, so the margin alone does not "
            "tell the arms apart: the claim rests on gradual warmup lying closer (the second "
            "interval)"
        )
    window = early_window(df)
    early = f"epochs {window[0]:.3g}-{window[1]:.3g}, after the warmup"
    return [
        studies.finding(
            f"with gradual warmup the large minibatch's training loss matches the small "
            f"minibatch's after the first epochs (within ±{MATCH_PCT:g}% over the second half of "
            f"training) and lies closer to it than without warmup",
            every(
                studies.verdict(
                    g["gradual"]["late"], [0.0] * n, within=MATCH_PCT, paired=True, unit=unit
                ),
                studies.verdict(
                    g["none"]["late"], g["gradual"]["late"], more_than=0.0, paired=True, unit=unit
                ),
            ),
            f"gap {_gap_text(g['gradual']['late'])} over the second half (mean of {n}; no warmup "
            f"{_gap_text(g['none']['late'])}; paper Figs. 2c and 4: the curves match closely "
            f"after the warmup)" + alone,
            paper="Goyal Figs. 2c and 4: qualitative, with gradual warmup the 8k training curve "
            "matches the 256 one closely after the warmup; no number",
            budget=b,
        ),
        studies.finding(
            "without warmup the large minibatch's training loss lags the gradual-warmup run's "
            f"early (further above the small minibatch's over {early})",
            studies.verdict(
                g["none"]["early"], g["gradual"]["early"], more_than=0.0, paired=True, unit=unit
            ),
            f"gap to the small minibatch over {early}: no warmup "
            f"{_gap_text(g['none']['early'])}, gradual warmup {_gap_text(g['gradual']['early'])} "
            f"(mean of {len(g['gradual']['early'])}; paper Fig. 2a: without warmup the training "
            "error is higher early)",
            paper="Goyal Fig. 2a: qualitative, without warmup the 8k training error is higher "
            "early than with gradual warmup; no number",
            budget=b,
        ),
    ]


def _gap_text(values: list[float]) -> str:
    return f"{mean(values):+.1f}%" if values else "n/a"


# -- the pre-registered test (docs/verdicts.md, "Pre-registered") ------------------------------

# Goyal Table 1 at 8k: no warmup 24.84% against gradual 23.74% top-1 error
GOYAL_BENEFIT = 1.10
# per profile (docs/verdicts.md): "k", the large minibatch where the linear rule's lr sits at the
# stability edge; "seeds", fresh seeds, never used by a calibration, their number fixed before the
# runs from "sd", the measured per-pair sd of none − gradual; "ladder_ks", "ladder_seeds": the
# descriptive ladder beyond it (no verdict). fashion-long: twenty pairs sized at the sd 1.24
SETTINGS = {
    "fashion-long": {
        "k": 32,
        "seeds": tuple(range(4000, 4020)),
        "sd": 1.24,
        "ladder_ks": (64, 128),
        "ladder_seeds": (4000, 4001),
    }
}


def settings(profile: Profile) -> dict[str, Any]:
    """The profile's pre-registered test (:data:`SETTINGS`; {} where it has none)."""
    return SETTINGS.get(profile.name, {})


def preregistered_runs(profile: Profile) -> list[dict[str, Any]]:
    """The pre-registered test's runs (:data:`SETTINGS`), seed by seed (a pair's two runs
    side by side): no and gradual warmup at its k on each of its seeds; then the descriptive
    ladder, no and gradual warmup at each of its ks on its seeds. None where the profile has no
    test."""
    t = settings(profile)
    if not t:
        return []
    pairs = [(t["k"], s) for s in t["seeds"]] + [
        (k, s) for k in t["ladder_ks"] for s in t["ladder_seeds"]
    ]
    return [profile.keys(k=k, warmup=w, seed=s) for k, s in pairs for w in ("none", "gradual")]


def benefit_verdict(
    none: Sequence[float], gradual: Sequence[float], *, planned: int, chance: float | None = None
) -> Verdict:
    """The pre-registered claim on Δ = none − gradual (points of top-1 error, seed-paired; above
    0: gradual is better), with two decided outcomes: **replayed**, gradual beats none (the 95%
    interval wholly above 0; where it also lies below :data:`GOYAL_BENEFIT` the test says "by less
    than Goyal's"); **not replayed**, the benefit is smaller than Goyal's (the interval wholly
    below it, not above 0); **undecided** when it covers both, or when fewer than the ``planned``
    pairs ran (the rule holds for the planned number only). Invalid as every verdict is when an
    arm did not train."""
    first = fs.verdict(none, gradual, more_than=0.0, chance=chance, paired=True)
    if first.invalid or first.p is None:
        return first
    if len(none) != planned:
        return Verdict(None, f"{len(none)} of the {planned} pre-registered pairs ran")
    beats = stats.above(none, gradual, 0.0, paired=True)
    smaller = stats.below(none, gradual, GOYAL_BENEFIT, paired=True)
    iv = beats.interval
    words = (
        f"Δ {iv.diff:+.2f} points (none − gradual), 95% CI [{iv.low:+.2f}, {iv.high:+.2f}] "
        f"(paired t, n = {iv.n}); p = {beats.p_for:.3g} above 0, {smaller.p_for:.3g} below "
        f"{GOYAL_BENEFIT:g}"
    )
    if beats.p_for < stats.ALPHA:
        less = f", by less than Goyal's {GOYAL_BENEFIT:g}" if smaller.p_for < stats.ALPHA else ""
        return Verdict(
            True, test=f"{words}: gradual beats none{less}", p_for=beats.p_for, p_against=1.0
        )
    if smaller.p_for < stats.ALPHA:
        test = f"{words}: the benefit is smaller than Goyal's {GOYAL_BENEFIT:g} points"
        return Verdict(False, test=test, p_against=smaller.p_for, p_for=1.0)
    why = f"the interval covers both 0 and {GOYAL_BENEFIT:g}"
    return Verdict(None, why, test=words, p_for=beats.p_for, p_against=smaller.p_for)


def preregistered_findings(test, df, profile: Profile, metrics: Metrics = None) -> list[Finding]:
    """The pre-registered test's two claims (``test``: the runs of :func:`preregistered_runs`; ``df``: the
    study's own runs, whose k = 1 runs are the baseline): gradual against no warmup at the test's
    k (:func:`benefit_verdict`), with the per-pair sd the runs measured and the power it gives the
    planned pairs; and gradual warmup at that k close to the baseline (±:data:`CLOSE_PCT`,
    Welch's interval: the baseline's seeds are the study's own, not the test's). Then the
    ladder's, measured (:func:`ladder_findings`)."""
    t = settings(profile)
    test = studies.diverged_as_failed(test)
    k = float(t["k"])
    arm = test[test["k"] == k]
    none, gradual = (studies.errors(arm, warmup=w) for w in ("none", "gradual"))
    chance = studies.chance_of(test)
    n = len(t["seeds"])
    v = benefit_verdict(none, gradual, planned=n, chance=chance)
    power = ""
    if min(len(none), len(gradual)) >= 2 and len(none) == len(gradual):
        sd = float(np.std(np.subtract(none, gradual), ddof=1))
        p = stats.decision_power(0.0, GOYAL_BENEFIT, GOYAL_BENEFIT / 2, sd, len(none))
        power = (
            f"; per-pair sd {sd:.2f} (planned {t['sd']:g}): {len(none)} pairs decide with "
            f"{p:.0%} chance at it, whatever the true benefit"
        )
    p_, p_base, src, _ = _table1()
    b = studies.budget(arm, [k])
    base = studies.errors(df, k=float(df["k"].min()), warmup="none")
    return [
        studies.finding(
            f"pre-registered: at k={k:g} ({studies.kilo(studies.paper_batch(k))} by k · 256) "
            f"gradual warmup beats no warmup, or its benefit is smaller than Goyal's "
            f"{GOYAL_BENEFIT:g} points (seeds {t['seeds'][0]}-{t['seeds'][-1]}, fixed before "
            f"the runs)",
            v,
            f"none {mean(none):.2f}%, gradual {mean(gradual):.2f}% (mean of {len(gradual)})"
            + power,
            paper=f"{src}: none {p_['none']:.2f}% vs gradual {p_['gradual']:.2f}% error (8k)",
            budget=b,
        ),
        studies.finding(
            f"with gradual warmup k={k:g} comes close to the baseline (within "
            f"±{CLOSE_PCT:g} point; the baseline's seeds are the study's, unpaired)",
            studies.within(gradual, base, CLOSE_PCT, chance=chance, paired=False),
            f"{mean(gradual):.2f}% vs baseline {mean(base):.2f}% (means of {len(gradual)} and "
            f"{len(base)})",
            paper=f"{src}: gradual {p_['gradual']:.2f}% at 8k vs baseline {p_base:.2f}% at 256",
            budget=b,
        ),
        *ladder_findings(test, base, profile, metrics),
    ]


def warmup_peak(train, epochs: float) -> float:
    """The largest training loss over the first ``epochs`` (the warmup window) over the first
    step's loss: above 1, the loss rose past where it started (no warmup failing early)."""
    train = _train(train)
    loss = train["loss"].astype(float).to_numpy()
    inside = train["epoch"].astype(float).to_numpy() <= epochs + 1e-9
    return float(loss[inside].max() / loss[0]) if inside.any() else math.nan


def ladder(test, profile: Profile, metrics: Metrics = None):
    """The descriptive ladder (measured, no verdict): per k at and beyond the test's, warmup and
    seed of the ladder seeds, the final top-1 error and the warmup window's peak loss over the
    initial (:func:`warmup_peak`), where no warmup starts to fail."""
    t, load = settings(profile), curves(metrics)
    window = float(profile.base["warmup_epochs"])
    rows = test[test["seed"].isin(t["ladder_seeds"])].sort_values(["k", "warmup", "seed"])
    cols = ["k", "batch_size", "warmup", "seed", "status", "final_top1_error_pct"]
    peaks = [warmup_peak(load(d), window) for d in rows["run_dir"]]
    return rows[cols].assign(warmup_peak_over_initial=peaks).reset_index(drop=True)


def ladder_findings(test, base: Sequence[float], profile: Profile, metrics: Metrics = None):
    """The test's two claims at each of the ladder's ks, *measured* (two seeds carry no test:
    docs/verdicts.md): gradual warmup's mean error below no warmup's, and within ±:data:`CLOSE_PCT`
    of ``base`` (the study's k = 1 errors); each run's error and warmup peak (:func:`ladder`) in
    the evidence. Invalid where gradual warmup did not train (no warmup may fail: Goyal's point)."""
    test = studies.diverged_as_failed(test)
    chance, lad = studies.chance_of(test), ladder(test, profile, metrics)
    fig1 = ex.reference("batch_scaling").set_index("batch")["value"]
    out = []
    for k in settings(profile)["ladder_ks"]:
        rows = lad[lad["k"] == k]
        arm = {w: rows[rows["warmup"] == w] for w in ("none", "gradual")}
        none, gradual = (list(arm[w]["final_top1_error_pct"]) for w in arm)
        cols = ["final_top1_error_pct", "warmup_peak_over_initial"]
        runs = "; ".join(
            f"{w} " + ", ".join(f"{x:.2f}% (peak x{q:.2f})" for x, q in r[cols].to_numpy())
            for w, r in arm.items()
        )
        said = (
            f"seeds {', '.join(str(s) for s in sorted(set(rows['seed'])))}: {runs} (peak: the "
            f"largest training loss over the first {profile.base['warmup_epochs']:g} epochs over "
            "the first step's); "
        )
        why = fs.untrained(gradual, chance) if gradual and none else "an arm has no run"
        b, budget = studies.paper_batch(k), studies.budget(test, [k])
        at = f"k={k:g} ({studies.kilo(b)} by k · 256)"
        m = f"measured: {len(gradual)} seeds, no test"
        benefit, gap = mean(none) - mean(gradual), mean(gradual) - mean(base)
        for claim, holds, number, paper in (
            (
                f"ladder: at {at} gradual warmup beats no warmup ({m})",
                benefit > 0,
                f"Δ {benefit:+.2f} points (none − gradual; the claim: above 0)",
                f"Goyal Table 1: no run without warmup beyond 8k (gradual {fig1[8192]:.2f}% at 8k)",
            ),
            (
                f"ladder: with gradual warmup {at} comes close to the baseline (within "
                f"±{CLOSE_PCT:g} point; {m})",
                abs(gap) < CLOSE_PCT,
                f"Δ {gap:+.2f} points (gradual − baseline {mean(base):.2f}%, mean of {len(base)}; "
                f"the claim: inside ±{CLOSE_PCT:g})",
                f"Goyal Fig. 1: {fig1[b]:.2f}% at {studies.kilo(b)} vs {fig1[256]:.2f}% at 256",
            ),
        ):
            v = Verdict(None, why, invalid=True) if why else Verdict(holds)
            out.append(studies.finding(claim, v, said + number, paper=paper, budget=budget))
    return out
