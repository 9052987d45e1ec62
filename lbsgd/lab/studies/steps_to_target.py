"""15. Steps to a target error (Shallue et al. 2018; McCandlish et al. 2018): what a batch size
buys, free of the epoch budget.

The ladder (:data:`SETTINGS`): each k at the lrs ``base_lr × k × f`` (f in :data:`LR_FACTORS`)
with the first seed, on the training split less the held-out images evaluated at log-spaced steps
(:data:`PER_OCTAVE`), ending at the target (:func:`steps_to_error`: the first crossing); per k the
lr of fewest steps is trained with the other seeds, which alone measure, and S = S_min (1 +
B_crit/B) is fitted with jackknife-t intervals (:class:`stats.SeedSteps`). A best lr on the grid's edge
is no tuned choice: the claims that read that k are invalid. docs/studies.md ("Study 15").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lbsgd.config import ConfigError
from lbsgd.lab import experiments as ex
from lbsgd.lab import findings as fs
from lbsgd.lab import stats
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import Metrics, batch_scaling, critical_batch, curves, scales
from lbsgd.lab.studies.rules import finding, goyal_steps, grid_edge, paper_batch
from lbsgd.lab.studies.scales import Profile

STUDY = "steps_to_target"
TITLE = "15. Steps to a target error (Shallue et al. 2018)"
LR_FACTORS = (0.5, 1.0, 2.0)  # the lr grid at every k: the linear rule's lr and x2 either side
PER_OCTAVE = 4  # held-out evaluations per doubling of the step count (a ratio of 2^(1/4) apart)
ERROR = "val_top1_error_pct"
# "the steps halve as the batch doubles": the slope of log2 steps on log2 batch within −1 ± 0.25,
# i.e. each doubling saves a factor between 2^0.75 = 1.68 and 2^1.25 = 2.38 of the steps
PERFECT = -1.0
SLOPE_MARGIN = 0.25
FACTOR = critical_batch.FACTOR  # "agrees": B_crit within x2 of B_noise (McCandlish Fig. 4)
PAPER = (
    "Shallue et al. 2018 (Figs. 1-2): steps to a target error fall as 1/B up to a workload's "
    "critical batch, then level off; Goyal Fig. 1: error flat up to 8k"
)


# the ladder per profile: "ks", the batch sizes as k; "target", the held-out top-1 error (%) every
# one of them reaches; "stop_at_error", where its runs end (default the target); "holdout", the
# images held out to read it on; "seeds", the tuning seed (each trial's), then the seeds that
# measure each k at its chosen lr; "lr_factors", the grid; "keys", config keys of every run
SETTINGS: dict[str, Mapping[str, Any]] = {
    "smoke": {
        "ks": (1, 4, 16),
        "target": 85.0,
        "holdout": 200,
        "seeds": (0, 1),
        "keys": {"epochs": 4, "base_lr": 0.1},
    },
    # a constant lr after the warmup, at most 4 epochs; seed 0 chooses each k's lr, seeds 2-7
    # measure; the target 24% is where the spread of steps is least (its history: docs/studies.md,
    # profile notes)
    "fashion-long": {
        "ks": (1, 4, 8, 16, 32, 64),
        "target": 24.0,
        "stop_at_error": 22.0,
        "holdout": 5_000,
        "seeds": (0, 2, 3, 4, 5, 6, 7),
        "lr_factors": (0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0),
        "keys": {"epochs": 4, "milestones": []},
    },
}


def settings(profile: Profile) -> Mapping[str, Any]:
    """The profile's ladder (:data:`SETTINGS`; {} where it has none)."""
    return scales.settings(profile, SETTINGS)


# -- the runs ----------------------------------------------------------------------------------


def check(profile: Profile) -> None:
    """One line naming the profile when it has no ladder."""
    if not settings(profile):
        have = ", ".join(SETTINGS)
        raise ConfigError(
            f"profile={profile.name!r} has no ladder for study 15 (steps_to_target.SETTINGS; valid: {have})"
        )


def base_lr(profile: Profile) -> float:
    """The linear rule's lr per reference batch of the ladder: its own ``keys``' base_lr, else the
    profile's; the lr grid is this times :data:`LR_FACTORS`."""
    return float({**profile.base, **settings(profile).get("keys", {})}["base_lr"])


def run_keys(profile: Profile, k: float, factor: float, seed: int, target: float) -> dict[str, Any]:
    """One run of the ladder: lr base_lr x factor per reference batch (x k by the linear rule), the
    held-out images set aside and probed at log-spaced steps, the noise scale measured (off where
    the batch is B_small: nothing to compare), ended at the first probe that reaches the ladder's
    ``stop_at_error`` (default and at most ``target``; below it, a curve read past its crossing)."""
    b_small = batch_scaling.small_batch(profile)
    lad = settings(profile)
    stop = min(target, lad.get("stop_at_error", target))
    keys = profile.keys(
        k=k,
        **{
            **lad.get("keys", {}),
            "base_lr": base_lr(profile) * factor,
            "holdout": lad["holdout"],
            "eval_per_octave": PER_OCTAVE,
            "seed": seed,
            "stop_at_error": stop,
        },
    )
    on = keys["batch_size"] > b_small
    return {**keys, "noise_scale": on, "noise_scale_batch": b_small if on else None}


def lr_grid(
    lr_factors: Sequence[float] | None = None, profile: Profile | None = None
) -> tuple[float, ...]:
    """The notebook's lr factors (None: the ladder's ``lr_factors``, else :data:`LR_FACTORS`):
    three or more distinct numbers > 0, so that the grid has an inside; else one line."""
    own = settings(profile).get("lr_factors", LR_FACTORS) if profile is not None else LR_FACTORS
    grid = tuple(own if lr_factors is None else lr_factors)
    good = all(isinstance(f, int | float) and not isinstance(f, bool) and f > 0 for f in grid)
    if len(grid) < 3 or not good or len(set(grid)) != len(grid):
        raise ConfigError(
            f"lr_factors={list(grid)!r} must be three or more distinct numbers > 0 (a grid "
            "with an inside: a best lr on its edge is no tuned choice)"
        )
    return tuple(sorted(grid))


def target_of(profile: Profile, target: float | None = None) -> float:
    """The held-out top-1 error (%) to reach: ``target``, else the ladder's; one line if it is
    not a percentage strictly between 0 and 100."""
    t = settings(profile)["target"] if target is None else target
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < 100:
        raise ConfigError(f"target={t!r} must be a held-out top-1 error in % (0 < target < 100)")
    return float(t)


def trials(
    profile: Profile,
    ks: Sequence[float] | None = None,
    lr_factors: Sequence[float] | None = None,
    seed: int | None = None,
    target: float | None = None,
) -> list[dict[str, Any]]:
    """The tuning runs: every k of ``ks`` (default the ladder's) at every lr factor (default the
    ladder's grid, :func:`lr_grid`), with ``seed`` (default the ladder's first: the tuning seed),
    each ended at ``target`` (:func:`target_of`)."""
    check(profile)
    s = settings(profile)["seeds"][0] if seed is None else seed
    grid, goal = lr_grid(lr_factors, profile), target_of(profile, target)
    return [run_keys(profile, k, f, s, goal) for k in ks or settings(profile)["ks"] for f in grid]


def confirmations(
    profile: Profile, chosen, seeds: Sequence[int] | None = None, target: float | None = None
) -> list[dict]:
    """Each k's chosen lr factor (``chosen``: :func:`choose`) with the other seeds (default the
    ladder's after the first), ended at ``target`` (:func:`target_of`): the runs the claims read
    beside the tuning seed's."""
    check(profile)
    rest = list(seeds if seeds is not None else settings(profile)["seeds"][1:])
    goal = target_of(profile, target)
    return [run_keys(profile, r.k, r.lr_factor, s, goal) for r in chosen.itertuples() for s in rest]


# -- one run: the steps to the target ------------------------------------------------------------


def steps_to_error(evals, target: float, key: str = ERROR) -> float | None:
    """The first step at which the error ``key`` of the evaluations ``evals`` (records with
    ``step``; those without the key skipped) reaches ``target`` (≤), interpolated between that
    evaluation and the one before it linearly in log step (they lie 2^(1/PER_OCTAVE) apart); the
    first evaluation's step if it is already there; None if the error never reaches it. A noisy
    curve that crosses twice counts its first crossing."""
    import pandas as pd

    if "kind" in evals:
        evals = evals[evals["kind"] == "eval"]
    if key not in evals:
        return None
    e = evals[["step", key]].assign(**{key: pd.to_numeric(evals[key], errors="coerce")})
    e = e.dropna().sort_values("step")
    steps, err = e["step"].to_numpy(dtype=float), e[key].to_numpy(dtype=float)
    hit = np.flatnonzero(err <= target)
    if len(hit) == 0:
        return None
    i = int(hit[0])
    if i == 0:
        return float(steps[0])
    frac = (err[i - 1] - target) / (err[i - 1] - err[i])
    return float(2 ** (math.log2(steps[i - 1]) + frac * math.log2(steps[i] / steps[i - 1])))


def records(run_dir):
    """A run's ``metrics.jsonl`` records of every kind (train and eval) as one DataFrame."""
    import pandas as pd

    return pd.DataFrame(ex.read_metrics(Path(run_dir, "metrics.jsonl")))


def measure(df, target: float, base_lr: float, metrics: Metrics = None):
    """``df`` (the runs) with ``lr_factor`` (the run's base_lr over the profile's ``base_lr``),
    ``steps_to_target`` (NaN: never reached) and ``b_noise_target`` (B_simple there).
    ``metrics``: run_dir → its records of both kinds (None: read metrics.jsonl)."""
    load = curves(metrics) if metrics is not None else records
    out = df.copy().reset_index(drop=True)
    out["k"] = out["k"].astype(float)
    out["lr_factor"] = [round(float(b) / base_lr, 6) for b in out["base_lr"]]
    steps, noise = [], []
    for d in out["run_dir"]:
        rec = load(d)
        s = steps_to_error(rec, target)
        steps.append(math.nan if s is None else s)
        noise.append(math.nan if s is None else critical_batch.b_noise_at(rec, math.ceil(s)))
    out["target_error"] = target
    out["steps_to_target"] = steps
    out["b_noise_target"] = noise
    return out


# -- per batch size: the best lr ------------------------------------------------------------------


def choose(m, tuning_seed: int):
    """Per k, the lr factor whose tuning-seed run reaches the target in the fewest steps (never
    reaching counts as infinitely many), ties to the smaller lr; with ``lr_at_grid_edge`` ("low",
    "high" or ""), and over the measuring seeds' runs at that factor (every seed but the tuning
    one; the tuning seed's alone before they ran): ``steps_to_target`` (their geometric mean; NaN
    unless every one reached the target), ``reached``, ``seeds``."""
    import pandas as pd

    rows = []
    for k, g in m.groupby("k", sort=True):
        tuning = g[g["seed"] == tuning_seed]
        cost = {
            float(r.lr_factor): (
                r.steps_to_target if math.isfinite(r.steps_to_target) else math.inf
            )
            for r in tuning.itertuples()
        }
        if not cost:
            continue
        best = min(sorted(cost), key=lambda f: cost[f])
        sel = measuring(g[g["lr_factor"] == best], tuning_seed)
        steps = sel["steps_to_target"].to_numpy(dtype=float)
        reached = bool(np.isfinite(steps).all())
        rows.append(
            {
                "k": k,
                "batch_size": int(sel["batch_size"].iloc[0]),
                "lr_factor": best,
                "peak_lr": float(sel["lr"].iloc[0]),
                "lr_at_grid_edge": grid_edge(sorted(cost), best) if len(cost) >= 3 else "",
                "reached": int(np.isfinite(steps).sum()),
                "seeds": len(sel),
                "steps_to_target": float(2 ** np.log2(steps).mean()) if reached else math.nan,
                "b_noise_target": float(sel["b_noise_target"].mean()),
                "final_val_top1_error_pct": float(sel["final_val_top1_error_pct"].mean()),
                "total_steps": int(sel["total_steps"].iloc[0]),
            }
        )
    return pd.DataFrame(rows)


def measuring(m, tuning_seed: int | None):
    """The runs of ``m`` whose seed is not ``tuning_seed`` (the seeds that measure, disjoint from
    the one that chose the lr), or ``m`` itself where only the tuning seed ran (or None)."""
    if tuning_seed is None:
        return m
    rest = m[m["seed"] != tuning_seed]
    return rest if len(rest) else m


def trial_table(m):
    """Every run: k, lr factor, seed, steps to the target (NaN: never), final held-out error (a
    run that ended at its target: the error there)."""
    cols = ["k", "batch_size", "lr_factor", "lr", "seed", "steps_to_target", "total_steps"]
    cols += ["final_val_top1_error_pct", "b_noise_target"]
    return m[cols].sort_values(["k", "lr_factor", "seed"]).reset_index(drop=True)


def chosen_runs(m, c, tuning_seed: int | None = None):
    """The runs of ``m`` at each k's chosen lr factor (``c``: :func:`choose`); with
    ``tuning_seed``, the measuring seeds' alone (:func:`measuring`)."""
    pick = dict(zip(c["k"], c["lr_factor"], strict=True))
    at = m[[pick.get(k) == f for k, f in zip(m["k"], m["lr_factor"], strict=True)]]
    return measuring(at, tuning_seed)


# the measuring seeds' runs at each k's chosen lr, every digit: seed_steps.csv, study 16's reference
SEED_STEPS = ["k", "batch_size", "seed", "lr_factor", "steps_to_target", "b_noise_target"]
SEED_STEPS += ["total_steps", "target_error"]


def seed_steps(m, c, tuning_seed: int) -> stats.SeedSteps:
    """:class:`stats.SeedSteps` of the measuring seeds' runs at each k's chosen lr (``c``)."""
    return stats.SeedSteps.of(chosen_runs(m, c, tuning_seed))


def saved_by_doubling(c) -> list[float]:
    """Per k, the factor by which its steps exceed the next k's, per doubling of the batch
    ((S(B)/S(B'))^(1/log2(B'/B)): 2 where the steps halve); NaN for the last k or a k that never
    reached the target."""
    b = c["batch_size"].astype(float).to_numpy()
    st = c["steps_to_target"].astype(float).to_numpy()
    out = [
        (st[i] / st[i + 1]) ** (1 / math.log2(b[i + 1] / b[i]))
        if math.isfinite(st[i]) and math.isfinite(st[i + 1])
        else math.nan
        for i in range(len(b) - 1)
    ]
    return [*out, math.nan]


def region(saved: float) -> str:
    """Shallue et al.'s region of a doubling that saves ``saved`` x the steps: "perfect scaling"
    when it saves at least 2^(1 − SLOPE_MARGIN) (the claim's margin), "maximal data parallelism"
    when at most 2^SLOPE_MARGIN, "diminishing returns" between; "" without a value."""
    if not math.isfinite(saved):
        return ""
    if saved >= 2 ** (-PERFECT - SLOPE_MARGIN):
        return "perfect scaling"
    if saved <= 2**SLOPE_MARGIN:
        return "maximal data parallelism"
    return "diminishing returns"


def intervals(s: stats.SeedSteps) -> dict[str, Any]:
    """The 95% jackknife-t intervals over the seeds: per k of the geometric mean steps
    (``steps_low``, ``steps_high``: arrays), and of the fit's S_min and B_crit; empty with fewer
    than two seeds."""
    if len(s.seeds) < 2:
        return {}
    per_k = [s.interval(lambda i, j=j: s.means(i)[j]) for j in range(len(s.batches))]

    def of(attr: str) -> tuple[float, float]:
        iv = s.interval(lambda i: fitted(s.fit(i), attr))
        return iv.low, iv.high

    return {
        "steps_low": [iv.low for iv in per_k],
        "steps_high": [iv.high for iv in per_k],
        "s_min": of("s_min"),
        "b_crit": of("b_crit"),
    }


def fitted(f: stats.Fit | None, attr: str) -> float:
    """A fit's ``attr`` (``s_min``, ``b_crit``) on some seeds: NaN without a fit; ∞ held to 1e9."""
    return math.nan if f is None else float(min(getattr(f, attr), 1e9))


def table(c, f: stats.Fit | None, s: stats.SeedSteps | None = None):
    """Per k: the chosen lr, the steps to the target (with ``s``, the measuring seeds: their
    jackknife-t interval), the steps perfect scaling from the smallest k would give, the factor the
    next doubling saves and its region (:func:`region`), the fit's steps; the fit's S_min, E_min,
    B_crit (with their intervals) in every row."""
    t = c.copy()
    first = t.dropna(subset=["steps_to_target"]).head(1)
    if len(first):
        b0, s0 = float(first["batch_size"].iloc[0]), float(first["steps_to_target"].iloc[0])
        t["perfect_scaling_steps"] = s0 * b0 / t["batch_size"].astype(float)
    else:
        t["perfect_scaling_steps"] = math.nan
    t["saved_by_doubling"] = saved_by_doubling(t)
    t["region"] = [region(x) for x in t["saved_by_doubling"]]
    t["fit_steps"] = f.steps(t["batch_size"].astype(float)) if f else math.nan
    # Goyal's side: the minibatch a k stands for (k · 256) and the steps of his 90 ImageNet
    # epochs there (he reports the error flat up to 8k, 14,076 steps)
    t["paper_batch"] = [paper_batch(k) for k in t["k"]]
    t["paper_goyal_steps"] = [goyal_steps(b) for b in t["paper_batch"]]
    t["s_min"] = f.s_min if f else math.nan
    t["e_min"] = f.e_min if f else math.nan
    t["b_crit"] = f.b_crit if f else math.nan
    iv = intervals(s) if s is not None else {}
    if iv:
        t["steps_low"], t["steps_high"] = iv["steps_low"], iv["steps_high"]
    for name in ("s_min", "b_crit"):  # NaN without intervals
        t[f"{name}_low"], t[f"{name}_high"] = iv.get(name, (math.nan, math.nan))
    return t


# -- the findings -------------------------------------------------------------------------------


def findings(m, large_k: float, tuning_seed: int) -> list[Finding]:
    """Perfect scaling up to ``large_k`` (Goyal's 8k in steps), diminishing returns beyond it, and
    B_crit within x2 of the noise scale at the target, each read from the measuring seeds' runs
    (every seed but ``tuning_seed``, which chose the lrs: :func:`choose`)."""
    c = choose(m, tuning_seed)
    s = seed_steps(m, c, tuning_seed)
    halves = (
        f"the steps to the target halve as the batch doubles up to k={large_k:g} (within the "
        f"margin: each doubling divides them by x{2 ** -(PERFECT + SLOPE_MARGIN):.2f} to "
        f"x{2 ** -(PERFECT - SLOPE_MARGIN):.2f})"
    )
    beyond = f"beyond k={large_k:g} a doubling saves less than the perfect-scaling halving"
    return [
        _slope_claim(m, c, [k for k in c["k"] if k <= large_k], halves, tuning_seed),
        _slope_claim(m, c, [k for k in c["k"] if k >= large_k], beyond, tuning_seed, above=True),
        _b_crit(s),
    ]


def _slope_claim(m, c, ks: Sequence[float], claim: str, tuning_seed: int, above=False) -> Finding:
    """A claim on the slope of log2 steps on log2 batch over the batch sizes ``ks`` (the measuring
    seeds' runs): within :data:`PERFECT` ± :data:`SLOPE_MARGIN`, or with ``above`` above the
    margin's upper edge; invalid when one of them is untuned or never reaches the target,
    undecided with fewer than two."""
    steps = _steps_text(c, ks)
    sel = c[c["k"].isin(list(ks))]
    edge, never = sel[sel["lr_at_grid_edge"] != ""], sel[sel["steps_to_target"].isna()]
    why = (
        f"k={edge['k'].iloc[0]:g}'s best lr sits on the {edge['lr_at_grid_edge'].iloc[0]} edge "
        "of its grid"
        if len(edge)
        else f"k={never['k'].iloc[0]:g} does not reach the target with every seed"
        if len(never)
        else None
    )
    if why is not None or len(ks) < 2:
        v = fs.Verdict(None, why or "fewer than two batch sizes", invalid=why is not None)
        return finding(claim, v, steps, paper=PAPER)
    runs_ = chosen_runs(m, c, tuning_seed)
    runs_ = runs_[runs_["k"].isin(list(ks))]
    x = [math.log2(float(b)) for b in runs_["batch_size"]]
    y = [math.log2(float(s)) for s in runs_["steps_to_target"]]
    if above:
        t = stats.slope_above(x, y, PERFECT + SLOPE_MARGIN)
        across = f"the threshold {PERFECT + SLOPE_MARGIN:+g}"
    else:
        t = stats.slope_within(x, y, PERFECT, SLOPE_MARGIN)
        across = f"the margin {PERFECT:g} ± {SLOPE_MARGIN:g}"
    iv = t.interval
    words = (
        f"slope of log2 steps on log2 batch {iv.diff:+.2f}, 95% CI [{iv.low:+.2f}, {iv.high:+.2f}] "
        f"({iv.test}, n = {iv.n} runs), p = {t.p:.3g}: each doubling divides the steps by "
        f"x{2**-iv.diff:.2f}, 95% CI [x{2**-iv.high:.2f}, x{2**-iv.low:.2f}] (halving: x2)"
    )
    v = fs.decide(t.p_for, t.p_against, words, f"the interval reaches across {across}")
    return finding(claim, v, steps, paper=PAPER)


def _b_crit(s: stats.SeedSteps) -> Finding:
    claim = (
        f"the fitted B_crit = E_min/S_min agrees with B_noise at the target (within x{FACTOR:g})"
    )
    paper = "McCandlish et al. 2018 Fig. 4: B_crit tracks B_noise to about x2"
    f = s.fit()
    if f is None or not 0 < f.b_crit < math.inf:
        v = fs.Verdict(None, "no finite critical batch from the fit")
        return finding(claim, v, "", paper=paper)
    rows = [j for j in range(len(s.batches)) if np.isfinite(s.noise[j]).all()]
    if not rows:
        v = fs.Verdict(None, "no run measured the noise scale at the target")
        return finding(claim, v, "", paper=paper)
    measured = s.noise[rows]  # B_noise at the target over every batch that measured it

    def noise(idx=None) -> float:
        return float(np.exp(np.log(measured if idx is None else measured[:, idx]).mean()))

    def ratio(idx) -> float:
        return fitted(s.fit(idx), "b_crit") / noise(idx)

    point = f.b_crit / noise()
    iv = intervals(s)
    per_batch = np.exp(np.log(measured).mean(axis=1))
    evidence = (
        f"fit S_min {f.s_min:.3g}{_bracket(iv, 's_min')}, E_min {f.e_min:.4g}, B_crit "
        f"{f.b_crit:.4g}{_bracket(iv, 'b_crit')} (rms residual {f.rms:.2f}, {f.points} batch "
        f"sizes, geometric means of {len(s.seeds)} seeds); B_noise {noise():.4g} (geometric mean "
        f"over batches {', '.join(f'{b:g}' for b in s.batches[rows])} and the seeds; per batch "
        f"{per_batch.min():.4g} to {per_batch.max():.4g}): ratio {point:.2f} (the claim: "
        f"x{1 / FACTOR:g} to x{FACTOR:g})"
    )
    if len(s.seeds) < 2:
        v = fs.Verdict(None, "one measuring seed: no interval")
        return finding(claim, v, evidence, paper=paper)
    t = stats.band(s.jackknife(ratio), point, 1 / FACTOR, FACTOR, len(s.seeds))
    iv = t.interval
    words = f"95% CI [{iv.low:.2f}, {iv.high:.2f}] ({iv.test}, n = {iv.n}), p = {t.p:.3g}"
    v = fs.decide(t.p_for, t.p_against, words, f"the interval reaches across x{FACTOR:g}")
    return finding(claim, v, evidence, paper=paper)


def _bracket(iv: dict[str, Any], name: str) -> str:
    """ " [low, high]" of :func:`intervals`' ``name`` (its 95% jackknife-t interval), or ""."""
    if name not in iv:
        return ""
    lo, hi = iv[name]
    return f" [{lo:.4g}, {hi:.4g}]"


def _steps_text(c, ks: Sequence[float]) -> str:
    sel = c[c["k"].isin(list(ks))]
    parts = []
    for r in sel.itertuples():
        steps = f"{r.steps_to_target:.0f}" if math.isfinite(r.steps_to_target) else "never"
        edge = f", {r.lr_at_grid_edge} edge" if r.lr_at_grid_edge else ""
        parts.append(f"k={r.k:g} {steps} (lr x{r.lr_factor:g}{edge}; {r.reached}/{r.seeds} seeds)")
    return "steps to the target: " + ", ".join(parts)
