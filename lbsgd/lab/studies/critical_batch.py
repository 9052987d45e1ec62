"""11. The critical batch size (McCandlish et al. 2018): notebook 3's batch-scaling sweep again,
measuring the gradient noise scale B_simple = tr(Σ)/|G|² (:mod:`lbsgd.noise_scale`) at every step.

Per run, the steps to a training-loss target (:func:`steps_to_target`) and B_simple there, early
and at the end; per batch, the seed means and the fit of S = S_min (1 + B_crit/B) (:func:`fit`).
The target is on the moving average of the per-step training loss, which resolves single steps
(lbsgd evaluates the error only every few epochs). The runs are notebook 3's (the probe changes no
digit), in this study's folder. docs/noise-scale.md ("Study 11").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lbsgd.lab import experiments as ex
from lbsgd.lab import stats, studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import Metrics, Verdict, at_chance, batch_scaling, curves, mean
from lbsgd.lab.studies.scales import Profile

STUDY = "critical_batch"
TITLE = "11. Critical batch size (McCandlish et al. 2018)"
# default moving-average window of the training loss: a tenth of an epoch (cpu: 2,000 samples,
# i.e. 125 steps at k = 1 and one step from k = 128; smoke: 200)
WINDOW_EPOCHS = 0.1
EARLY = 0.2  # "early in training": at 20% of the steps (or the end of the warmup, if later)
# the knee: the error leaves its flat region where the mean errors from the smallest k stop lying
# within this many points of each other (study 3's closeness margin is its own, an equivalence
# margin of 1 point; the knee locates a change, not a closeness claim)
FLAT_PCT = 2.0
FACTOR = 2.0  # "agrees": within a factor of 2 (McCandlish Fig. 4: B_crit tracks B_noise to ~×2)
B_NOISE = "gns_b_simple_ema"  # the smoothed B_simple of a step (metrics.jsonl)
# each run's steps to the target, every digit: steps.csv, beside fit.csv study 16's reference
RUN_STEPS = ["k", "batch_size", "seed", "steps_to_target", "b_noise_target", "total_steps"]


# -- the runs ----------------------------------------------------------------------------------


def runs(
    profile: Profile, seeds: Sequence[int], ks: Sequence[float] | None = None
) -> list[dict[str, Any]]:
    """Notebook 3's sweep (each k of ``ks``, default the profile's batch-scaling list: every seed up
    to ``large_k``, the first seed beyond) with the noise probe on (``noise_scale=true`` and
    ``noise_scale_batch`` = :func:`small_batch`; off where batch_size ≤ B_small: cpu and smoke,
    k = 1). A profile of ``batch_scaling.NOISE_SCALE`` (fashion) trains them in notebook 3."""
    return batch_scaling.runs(profile, seeds, ks, noise_scale=True)


# -- one run's curve ---------------------------------------------------------------------------


def _train(records):
    """The train records sorted by step, with numeric loss and B_simple (None → NaN)."""
    import pandas as pd

    if "kind" in records:
        records = records[records["kind"] == "train"]
    records = records.sort_values("step").reset_index(drop=True)
    records = records.assign(loss=pd.to_numeric(records["loss"], errors="coerce"))
    if B_NOISE in records:
        records = records.assign(**{B_NOISE: pd.to_numeric(records[B_NOISE], errors="coerce")})
    return records


def window_steps(window_samples: int, batch: int) -> int:
    """Steps in a window of ``window_samples`` samples at ``batch``:
    max(1, window_samples // batch)."""
    return max(1, int(window_samples) // int(batch))


def smoothed_loss(records, window_samples: int, batch: int):
    """The moving average of the per-step training loss over the last
    :func:`window_steps` steps (over the steps there are, at the start), indexed by step."""
    t = _train(records)
    w = window_steps(window_samples, batch)
    return t["loss"].rolling(w, min_periods=1).mean().set_axis(t["step"].astype(int))


def steps_to_target(records, target: float, window_samples: int, batch: int) -> int | None:
    """The first optimizer step at which the moving average of the training loss over the last
    max(1, window_samples // batch) steps is ≤ ``target``; None if it never is."""
    s = smoothed_loss(records, window_samples, batch)
    hit = s[s <= target]
    return int(hit.index[0]) if len(hit) else None


def b_noise_at(records, step: int | None = None) -> float:
    """The smoothed B_simple (``gns_b_simple_ema``) at ``step`` (None: the last step), or at the
    last step before it with a value (the ratio is None while the smoothed |G|² is ≤ 0); NaN when
    the run did not measure it."""
    t = _train(records)
    if B_NOISE not in t:
        return math.nan
    if step is not None:
        t = t[t["step"] <= step]
    v = t[B_NOISE].dropna()
    v = v[v > 0]
    return float(v.iloc[-1]) if len(v) else math.nan


def early_step(total_steps: int, warmup_steps: int) -> int:
    """ "Early in training": :data:`EARLY` of the steps, or the end of the warmup if later."""
    return max(1, int(warmup_steps), round(EARLY * total_steps))


# -- the measurements of a sweep ---------------------------------------------------------------


def default_target(df, large_k: float, window_samples: int, metrics: Metrics = None) -> float:
    """The smoothed final training loss of the runs at ``large_k`` (the largest k ≤ ``large_k`` of
    ``df``), the highest over seeds: a loss every seed of the large minibatch reaches in its
    budget (and the smaller minibatches, whose losses end lower, with it)."""
    load = curves(metrics)
    k = max(float(x) for x in df["k"] if float(x) <= large_k)
    sel = df[df["k"].astype(float) == k]
    finals = [
        float(smoothed_loss(load(d), window_samples, b).iloc[-1])
        for d, b in zip(sel["run_dir"], sel["batch_size"], strict=True)
    ]
    return max(finals)


def measure(
    df,
    large_k: float,
    target: float | None = None,
    window_samples: int | None = None,
    metrics: Metrics = None,
):
    """``df`` (the runs) with, per run: ``target_loss``, ``window_samples``,
    ``steps_to_target`` (None if never), ``b_noise_target`` (B_simple at that step),
    ``b_noise_early`` (at :func:`early_step`), ``b_noise_end``, and ``loss_early`` /
    ``loss_end`` (the smoothed training loss there). ``target`` None: :func:`default_target`;
    ``window_samples`` None: :data:`WINDOW_EPOCHS` of an epoch."""
    load = curves(metrics)
    window = window_samples or max(1, round(WINDOW_EPOCHS * int(df["num_train"].iloc[0])))
    if target is None:
        target = default_target(df, large_k, window, metrics)
    rows = []
    for _, r in df.iterrows():
        rec, b = load(r["run_dir"]), int(r["batch_size"])
        steps = steps_to_target(rec, target, window, b)
        early = early_step(int(r["total_steps"]), int(r["warmup_steps"]))
        loss = smoothed_loss(rec, window, b)
        upto = loss[loss.index <= early]
        rows.append(
            {
                "target_loss": target,
                "window_samples": window,
                "steps_to_target": steps,
                "b_noise_target": b_noise_at(rec, steps) if steps is not None else math.nan,
                "b_noise_early": b_noise_at(rec, early),
                "b_noise_end": b_noise_at(rec),
                "loss_early": float(upto.iloc[-1]) if len(upto) else math.nan,
                "loss_end": float(loss.iloc[-1]) if len(loss) else math.nan,
            }
        )
    import pandas as pd

    out = pd.concat([df.reset_index(drop=True), pd.DataFrame(rows, index=range(len(df)))], axis=1)
    out["steps_to_target"] = out["steps_to_target"].astype(float)  # NaN: never reached
    return out


def per_k(m):
    """Per k of the measured runs ``m``: batch, runs, mean and std of the final top-1 error, the
    seed-mean steps to the target (NaN unless every seed reached it; ``reached`` counts them) and
    B_simple at the target (seed mean over the runs that measured it)."""
    g = m.assign(k=m["k"].astype(float)).groupby("k", sort=True)
    t = ex.summarize(m.assign(k=m["k"].astype(float)), ["k", "batch_size"])
    t["reached"] = g["steps_to_target"].count().to_numpy()
    t["steps_to_target"] = [
        grp["steps_to_target"].mean() if grp["steps_to_target"].notna().all() else math.nan
        for _, grp in g
    ]
    t["b_simple_at_target"] = g["b_noise_target"].mean().to_numpy()
    return t


# -- the model S(B) = S_min (1 + B_crit / B) (lbsgd.lab.stats.fit_steps) ---------------------


def fit_runs(m) -> stats.Fit | None:
    """:func:`fit` of the seed-mean steps to the target of each k (those every seed reached)."""
    t = per_k(m).dropna(subset=["steps_to_target"])
    return stats.fit_steps(t["batch_size"].astype(float), t["steps_to_target"])


# -- the knee of the error ---------------------------------------------------------------------


def knee(m) -> tuple[int, int | None]:
    """Where the error-vs-batch curve leaves its flat region (batch_scaling's rule): the longest
    run of ks from the smallest whose mean errors lie within FLAT_PCT points of each other; the
    interval [its last batch, the next batch] (None: flat over the whole sweep)."""
    t = per_k(m)
    errs, batches = list(t["final_top1_error_pct_mean"]), [int(b) for b in t["batch_size"]]
    last = 0
    for i in range(1, len(errs)):
        if max(errs[: i + 1]) - min(errs[: i + 1]) >= FLAT_PCT:
            break
        last = i
    return batches[last], batches[last + 1] if last + 1 < len(batches) else None


def within_factor(value: float, lo: float, hi: float | None, factor: float = FACTOR) -> bool:
    """``value`` in [lo/factor, hi·factor] (hi None: no upper end)."""
    return lo / factor <= value and (hi is None or value <= hi * factor)


# -- the table ---------------------------------------------------------------------------------


def baseline_k(m) -> float | None:
    """The smallest k whose every seed of the study (those of the smallest k) measured B_simple at
    the target; None if no k did."""
    seeds = set(m[m["k"].astype(float) == m["k"].astype(float).min()]["seed"])
    for k in sorted({float(x) for x in m["k"]}):
        sel = m[m["k"].astype(float) == k]
        ok = set(sel[np.isfinite(sel["b_noise_target"].astype(float))]["seed"])
        if seeds <= ok:
            return k
    return None


def table(m, f: stats.Fit | None):
    """Per k: batch, runs, the error (mean, std), the steps to the target, B_simple at the target
    (seed means) and the steps the fit predicts."""
    t = per_k(m)
    t["fit_steps"] = f.steps(t["batch_size"].astype(float)) if f is not None else math.nan
    return t.astype({"batch_size": "Int64", "runs": "Int64", "reached": "Int64"})


def fit_table(m, f: stats.Fit | None):
    """One row: the target, the window, the fit's S_min, E_min, B_crit and its residual, the
    baseline's k, batch and B_simple at the target (seed mean), and the knee's interval."""
    import pandas as pd

    base = baseline_k(m)
    sel = m[m["k"].astype(float) == base] if base is not None else m.iloc[:0]
    lo, hi = knee(m)
    return pd.DataFrame(
        [
            {
                "target_loss": float(m["target_loss"].iloc[0]),
                "window_samples": int(m["window_samples"].iloc[0]),
                "s_min": f.s_min if f else math.nan,
                "e_min": f.e_min if f else math.nan,
                "b_crit": f.b_crit if f else math.nan,
                "fit_rms_rel": f.rms if f else math.nan,
                "fit_points": f.points if f else 0,
                "baseline_k": base,
                "baseline_batch": int(sel["batch_size"].iloc[0]) if len(sel) else None,
                "b_noise_at_target": mean(list(sel["b_noise_target"])) if len(sel) else math.nan,
                "knee_lo": lo,
                "knee_hi": hi,
            }
        ]
    )


# -- the findings ------------------------------------------------------------------------------


def _band(values: Sequence[float], lo: float, hi: float | None) -> Verdict:
    """Every seed's value within ×FACTOR of [lo, hi]: replayed; every seed outside: not
    replayed; else undecided."""
    inside = [within_factor(v, lo, hi) for v in values]
    if all(inside):
        return Verdict(True)
    if not any(inside):
        return Verdict(False)
    return Verdict(None, f"{sum(inside)} of {len(inside)} seeds inside the band")


def _fmt(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


def findings(m, f: stats.Fit | None = None) -> list[Finding]:
    """From the measured runs ``m`` (:func:`measure`) and the fit ``f`` (default
    :func:`fit_runs`):

    1. B_noise at the target lands within ×2 of the knee of the error (the baseline's seeds, the
       baseline the smallest k measuring it with every seed);
    2. B_simple grows during training (per seed, end vs early; paired over seeds on log2 B);
    3. the fitted B_crit = E_min/S_min agrees with B_noise within ×2 (McCandlish: B_crit ≈
       B_noise).
    """
    f = fit_runs(m) if f is None else f
    e = _evidence(m)
    return [_noise_at_the_knee(m, e), _noise_grows(e), _critical_batch_is_the_noise(f, e)]


@dataclass(frozen=True)
class _Evidence:
    """What every claim reads: the baseline's k, its runs by seed, their B_noise at the target, the
    evidence's opening words, and the verdict before any rule."""

    base: float | None
    sel: Any
    bn: list[float]
    head: str
    gate: Verdict | None


def _evidence(m) -> _Evidence:
    base = baseline_k(m)
    sel = (m[m["k"].astype(float) == base] if base is not None else m.iloc[:0]).sort_values("seed")
    bn = [float(v) for v in sel["b_noise_target"]]
    head = (
        f"baseline k={base:g} (batch {int(sel['batch_size'].iloc[0])}), B_noise at the "
        f"target loss {m['target_loss'].iloc[0]:.3g}: {_fmt(bn)} (seeds "
        f"{', '.join(str(int(s)) for s in sel['seed'])})"
        if base is not None
        else "no k measured the noise scale with every seed"
    )
    # before any rule: invalid when every run is at chance (nothing trained to measure);
    # undecided without a baseline or with fewer than two seeds
    chance, gate = studies.chance_of(m), None
    if at_chance([float(v) for v in m["final_top1_error_pct"]], chance):
        gate = Verdict(None, f"every run is at chance ({chance:.0f}% error)", invalid=True)
    elif base is None:
        gate = Verdict(None, "no k measured B_simple at the target with every seed")
    elif len(bn) < 2:
        gate = Verdict(None, "fewer than 2 seeds measured the noise scale: no seed spread")
    return _Evidence(base, sel, bn, head, gate)


def _noise_at_the_knee(m, e: _Evidence) -> Finding:
    """Claim 1: B_noise vs the knee of the error."""
    lo, hi = knee(m)
    band = f"[{lo / FACTOR:g}, {hi * FACTOR:g}]" if hi is not None else f"[{lo / FACTOR:g}, ∞)"
    knee_txt = (
        f"the error leaves its flat region (within {FLAT_PCT:g} points) between batch {lo} and {hi}"
        if hi is not None
        else f"the error is flat (within {FLAT_PCT:g} points) up to the largest batch, {lo}"
    )
    v1 = e.gate or _band(e.bn, lo, hi)
    why1 = ""
    if v1.replayed is False:
        above = hi is not None and min(e.bn) > hi * FACTOR
        side = "below" if max(e.bn) < lo / FACTOR else "above" if above else "outside"
        why1 = (
            f"; not replayed at this scale: every seed's B_noise lies {side} the band; the "
            "knee is in the final test error of a fixed epoch budget, B_noise predicts the "
            "steps to a training loss (claim 3 compares those)"
        )
    return studies.finding(
        "the measured noise scale lands within a factor of 2 of the batch where the error leaves "
        "its flat region",
        v1,
        f"{e.head}; {knee_txt}; ×2 band {band}{why1}",
        paper="McCandlish et al. 2018: qualitative, below B_crit ≈ B_noise a larger batch buys "
        "proportionally fewer steps, above it almost none; no number in the reference data",
    )


def _noise_grows(e: _Evidence) -> Finding:
    """Claim 2: B_simple grows during training (per seed, end vs early)."""
    early = [float(v) for v in e.sel["b_noise_early"]]
    end = [float(v) for v in e.sel["b_noise_end"]]
    pairs = [(a, b) for a, b in zip(early, end, strict=True) if a > 0 and b > 0]
    v2 = e.gate or (  # log2 B_simple at the end above early, paired over the seeds
        Verdict(None, "fewer than 2 seeds measured B_simple early and at the end")
        if len(pairs) < 2
        else studies.verdict(
            [math.log2(b) for _, b in pairs],
            [math.log2(a) for a, _ in pairs],
            more_than=0.0,
            paired=True,
            unit="in log2 B",
        )
    )
    grow = _growth_text(e.sel, early, end, pairs, v2) if pairs else ""
    return studies.finding(
        "B_simple grows during training (McCandlish et al. report it grows as the loss falls)",
        v2,
        (f"baseline k={e.base:g}" if e.base is not None else "no baseline") + grow,
        paper="McCandlish et al. 2018: qualitative, the noise scale grows as the loss falls; no "
        "number in the reference data",
    )


def _growth_text(sel, early, end, pairs, v2: Verdict) -> str:
    ratio = [b / a for a, b in pairs]
    le, ln = mean(list(sel["loss_early"])), mean(list(sel["loss_end"]))
    first = sel.iloc[0]
    at = early_step(int(first["total_steps"]), int(first["warmup_steps"]))
    grow = (
        f"; B_simple early (step {at}) "
        f"{_fmt(early)}, at the end {_fmt(end)}: ×{_fmt(ratio)} while the smoothed "
        f"training loss went from {le:.3g} to {ln:.3g}"
    )
    if v2.replayed is False:
        grow += (
            "; not replayed at this scale: B_simple does not grow on average over the "
            "seeds (geometric mean ×"
            f"{math.exp(statistics.fmean(math.log(r) for r in ratio)):.2f})"
        )
    return grow


def _critical_batch_is_the_noise(f: stats.Fit | None, e: _Evidence) -> Finding:
    """Claim 3: the fitted B_crit ≈ B_noise."""
    if f is None or f.points < 3:
        fit_txt = f"{f.points if f else 0} batch sizes reached the target: no fit to judge"
        v3 = e.gate or Verdict(None, "fewer than 3 batch sizes reached the target")
    else:
        fit_txt = (
            f"fit over {f.points} batch sizes: S_min {f.s_min:.3g} steps, E_min "
            f"{f.e_min:.3g} samples, B_crit = E_min/S_min = {f.b_crit:.3g} (rms relative "
            f"residual {100 * f.rms:.1f}%)"
        )
        v3 = e.gate or (
            _band(e.bn, f.b_crit, f.b_crit)
            if 0 < f.b_crit < math.inf
            else Verdict(
                None,
                f"the fit has no finite B_crit ({f.b_crit:g}): the steps "
                "do not both fall and level off over the sweep",
            )
        )
    finite = f is not None and 0 < f.b_crit < math.inf
    band = (
        f"; ×{FACTOR:g} band [{f.b_crit / FACTOR:.0f}, {f.b_crit * FACTOR:.0f}]" if finite else ""
    )
    why3 = ""
    if v3.replayed is False:
        side = "below" if max(e.bn) < f.b_crit else "above"
        why3 = (
            f"; not replayed at this scale: every seed's B_noise lies more than ×{FACTOR:g} "
            f"{side} B_crit (ratio {mean(e.bn) / f.b_crit:.2f})"
        )
    return studies.finding(
        "the fitted critical batch B_crit = E_min/S_min agrees with the measured noise scale "
        "within a factor of 2",
        v3,
        f"{fit_txt}; {e.head}{band}{why3}",
        paper="McCandlish et al. 2018 eq. 2.11 and Fig. 4: qualitative, B_crit = E_min/S_min ≈ "
        "B_noise; no number in the reference data",
    )
