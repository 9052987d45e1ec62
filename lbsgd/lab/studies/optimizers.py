"""14. Large-batch optimizers tuned on the same budget (Nado et al. 2021; You et al. 2017, 2019).

Nado et al. found Nesterov and Adam, tuned with LARS's and LAMB's care, matching them. Here
Nesterov, LARS, LAMB and AdamW each get the same tuning budget at two k (``profile.ks
["optimizers"]``): a grid (:class:`Grid`) or a quasi-random search (:class:`Search`) around each
optimizer's centre (:func:`anchor`), every trial trained with :data:`TUNING_SEED` and judged on the
held-out images only; each choice is then trained on the profile's seeds and only its test error
decides the findings. :func:`budget` states what the study spent; docs/studies.md ("Study 14").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from lbsgd.config import ConfigError
from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding, untrained
from lbsgd.lab.studies import lars, scales
from lbsgd.lab.studies.scales import PROFILES, Profile

STUDY = "optimizers"
TITLE = "14. Large-batch optimizers, tuned on the same budget (Nado et al. 2021)"

ARMS = ("nesterov", "lars", "lamb", "adamw")
# the pairs of the findings: (layer-wise, its plain optimizer)
PAIRS = (("lars", "nesterov"), ("lamb", "adamw"))
# peak lr = anchor x factor: 3 values over a factor of 9, the anchor in the middle
LR_FACTORS = (1 / 3, 1.0, 3.0)
WARMUPS = (0.25, 1.0)  # warmup length in epochs (gradual, from peak / k)
TUNING_SEED = 1000  # the trials' seed: none of the profiles' seeds, so the choice is not the test's
ADAM_WEIGHT_DECAY = 0.01  # You et al. 2019 (BERT with LAMB and AdamW)
VAL = "final_val_top1_error_pct"
TEST = "final_top1_error_pct"
COLORS = {"nesterov": "tab:red", "lars": "tab:green", "lamb": "tab:blue", "adamw": "tab:orange"}

# per profile: "holdout", the training images held out for tuning; "anchors", each optimizer's lr
# per reference batch, the centre of its tuning grid (scaled to k by :data:`RULES`); "centres",
# calibrated centres per k that replace the anchors; "grid", the grid's own axes (lr_factors,
# warmups, the tuning seeds); "search", a :class:`Search`'s; "keys", config keys of every run.
# cpu: Nesterov and LARS at the profile's lrs, LAMB and AdamW by the square-root rule from the
# best probes at k = 128; at k = 16 a first pass chose the grid's top (x3) for three of them: their
# grids centre there (docs/studies.md, profile notes)
_CPU = {"nesterov": 0.0125, "lars": 0.125, "lamb": 0.014, "adamw": 0.0035}
_CPU_16 = {"nesterov": 0.6, "lars": 6.0, "adamw": 0.042}
SETTINGS: dict[str, Mapping[str, Any]] = {
    "smoke": {"holdout": 200, "anchors": _CPU},
    "cpu": {"holdout": 4_000, "anchors": _CPU, "centres": {16: _CPU_16}},
    # Nesterov's anchor at the probe's 0.025 per 16, at k = 16 the profile's 0.05 (0.8); LARS,
    # LAMB and AdamW as on cpu (not probed on Fashion-MNIST)
    "fashion": {
        "holdout": 3_000,
        "anchors": {**_CPU, "nesterov": 0.025},
        "centres": {16: {**_CPU_16, "nesterov": 0.8}},
    },
    # k = 16 (below B_crit) on 30,000 images: 422 steps, centres at the best probes, Nado et al.'s
    # quasi-random search over lr, warmup and weight decay (docs/studies.md)
    "fashion-long": {
        "holdout": 3_000,
        "anchors": {"nesterov": 0.1, "lars": 1.125, "lamb": 0.014, "adamw": 0.0105},
        "centres": {16: {"nesterov": 1.6, "lars": 18.0, "lamb": 0.056, "adamw": 0.042}},
        "search": {"points": 10, "seeds": (1000, 1001, 1002)},
        "keys": {"fashion_train": 30_000, "epochs": 4},
    },
}


@dataclass(frozen=True)
class Tuned(Profile):
    """A profile with this study's settings given, not looked up (study 17's at its own k)."""

    tuning: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, profile: Profile, tuning: Mapping[str, Any], **changes: Any) -> Tuned:
        return cls(
            **{f.name: getattr(profile, f.name) for f in fields(Profile)} | changes, tuning=tuning
        )


def settings(profile: Profile) -> Mapping[str, Any]:
    """The profile's settings of this study (:data:`SETTINGS`; {} where it has none)."""
    return profile.tuning if isinstance(profile, Tuned) else scales.settings(profile, SETTINGS)


# the scaling rule of each optimizer's anchor: the peak lr at k is anchor x rule(k)
RULES = {"nesterov": "linear", "lars": "linear", "lamb": "sqrt", "adamw": "sqrt"}


# -- the runs ----------------------------------------------------------------------------------


def arm_keys(profile: Profile, arm: str) -> dict[str, Any]:
    """The config keys of optimizer ``arm`` (not its lr nor warmup): the LARS keys' poly(2)
    schedule for all four, so that the optimizers alone differ."""
    own, lars_ = settings(profile), lars.settings(profile)
    schedule = {k: v for k, v in lars_.items() if k in ("schedule", "poly_power")}
    keys = {
        "nesterov": {"optimizer": "sgd", "nesterov": True},
        "lars": {"optimizer": "lars", "nesterov": False, "lars_eta": lars_["lars_eta"]},
        "lamb": {"optimizer": "lamb", "nesterov": False, "weight_decay": ADAM_WEIGHT_DECAY},
        "adamw": {"optimizer": "adamw", "nesterov": False, "weight_decay": ADAM_WEIGHT_DECAY},
    }[arm]
    # the profile's own keys of this study (a shorter run, fewer images), under the optimizer's
    return {**own.get("keys", {}), **schedule, **keys, "holdout": own["holdout"]}


def check(profile: Profile) -> None:
    """One line naming the profile when it has no settings for this study."""
    if not settings(profile) or "optimizers" not in profile.ks:
        have = ", ".join(n for n in SETTINGS if "optimizers" in PROFILES[n].ks)
        raise ConfigError(
            f"profile={profile.name!r} has no tuning settings for study 14 (its tuning and "
            f"ks['optimizers']; valid: {have})"
        )


def anchor(profile: Profile, arm: str, k: float) -> float:
    """The centre of ``arm``'s lr grid at k (a peak lr): the profile's calibrated centre at that k
    (``tuning["centres"][k][arm]``) where it has one, else its anchor scaled by its rule (linear
    or sqrt)."""
    centre = settings(profile).get("centres", {}).get(k, {}).get(arm)
    if centre is not None:
        return centre
    a = settings(profile)["anchors"][arm]
    return a * k if RULES[arm] == "linear" else a * math.sqrt(k)


def weight_decay(profile: Profile, arm: str) -> float:
    """``arm``'s default weight decay: :data:`ADAM_WEIGHT_DECAY` for LAMB and AdamW, else the
    profile's (a search scales it by its factor)."""
    return float(arm_keys(profile, arm).get("weight_decay", profile.base["weight_decay"]))


def _run(
    profile: Profile, arm: str, k: float, base_lr: float, warmup: float, seed: int, decay=None
) -> dict:
    """One run's keys: the peak lr base_lr x k, reached by the linear rule from base_lr (Goyal's
    gradual warmup from the reference batch's lr); ``decay``: its weight decay (None: the arm's
    default, :func:`weight_decay`)."""
    keys = arm_keys(profile, arm)
    keys["weight_decay"] = weight_decay(profile, arm) if decay is None else decay
    gradual = {"base_lr": base_lr, "lr_scaling": "linear", "warmup": "gradual"}
    return profile.keys(k=k, **keys, **gradual, warmup_epochs=warmup, seed=seed)


def ks(profile: Profile, chosen: Sequence[float] | None = None) -> tuple[float, ...]:
    """The study's minibatches as k, smallest first."""
    return tuple(sorted(chosen or profile.ks["optimizers"]))


def _check_axis(name: str, values: tuple, ok, valid: str) -> None:
    """One axis of the grid: a non-empty list of distinct valid numbers, else one line."""
    good = all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and ok(v)
        for v in values
    )
    if not values or not good or len(set(values)) != len(values):
        raise ConfigError(f"{name}={list(values)!r} must be a non-empty list of distinct {valid}")


@dataclass(frozen=True)
class Grid:
    """The tuning grid: peak lrs as factors of the optimizer's anchor, warmup lengths in epochs,
    and the tuning seeds every setting is trained with (the choice reads their mean). Every
    optimizer at every k gets ``trials`` runs."""

    lr_factors: tuple[float, ...] = LR_FACTORS
    warmups: tuple[float, ...] = WARMUPS
    seeds: tuple[int, ...] = (TUNING_SEED,)

    @classmethod
    def of(
        cls,
        lr_factors: Sequence[float] | None,
        warmups: Sequence[float] | None,
        profile: Profile | None = None,
    ) -> Grid | Search:
        """The notebook's parameters (None: the profile's ``tuning["search"]``, a
        :class:`Search`, or its ``tuning["grid"]``, else the study's grid); one-line
        ConfigError if bad."""
        own = settings(profile) if profile is not None else {}
        if own.get("search") and lr_factors is None and warmups is None:
            return Search(**own["search"])
        own = own.get("grid", {}) or {}
        grid = cls(
            tuple(own.get("lr_factors", LR_FACTORS) if lr_factors is None else lr_factors),
            tuple(own.get("warmups", WARMUPS) if warmups is None else warmups),
            tuple(own.get("seeds", (TUNING_SEED,))),
        )
        _check_axis("lr_factors", grid.lr_factors, lambda v: v > 0, "numbers > 0")
        _check_axis("warmups", grid.warmups, lambda v: v >= 0, "epochs >= 0")
        return grid

    @property
    def trials(self) -> int:
        return len(self.settings()) * len(self.seeds)

    def settings(self) -> list[tuple[float, float, float]]:
        """(lr factor, warmup epochs, weight-decay factor) of each setting: the grid's product,
        at the default weight decay."""
        return [(f, w, 1.0) for f in self.lr_factors for w in self.warmups]


@dataclass(frozen=True)
class Search:
    """A quasi-random search, Nado et al. 2021's method: ``points`` settings of a scrambled
    Halton sequence (``scipy.stats.qmc``, seed 0) over the peak lr (log-uniform over
    ×2^±``lr_octaves`` of the optimizer's centre), the warmup (uniform over 0 to ``max_warmup``
    epochs) and the weight decay (log-uniform over ×2^±``decay_octaves`` of its default,
    :func:`weight_decay`). The same points, as factors, for every optimizer: equal budgets and
    the same relative search. Each setting with every tuning seed of ``seeds``."""

    points: int
    lr_octaves: float = 2.0
    max_warmup: float = 1.0
    decay_octaves: float = 2.0
    seeds: tuple[int, ...] = (TUNING_SEED,)

    @property
    def trials(self) -> int:
        return self.points * len(self.seeds)

    def settings(self) -> list[tuple[float, float, float]]:
        """(lr factor, warmup epochs, weight-decay factor) of each point, to 3 digits."""
        from scipy.stats import qmc

        u = qmc.Halton(d=3, scramble=True, rng=np.random.default_rng(0)).random(self.points)
        return [
            (
                _digits(2 ** (self.lr_octaves * (2 * a - 1))),
                _digits(self.max_warmup * b),
                _digits(2 ** (self.decay_octaves * (2 * c - 1))),
            )
            for a, b, c in u
        ]


def _digits(x: float) -> float:
    """``x`` to three significant digits (a config readable in its file)."""
    return float(f"{x:.3g}")


def trials(profile: Profile, grid: Grid | Search, ks_: Sequence[float] | None = None) -> list[dict]:
    """The tuning runs: every optimizer at every k, every setting of the grid or search, each
    with its tuning seeds (:data:`TUNING_SEED` and on: none of the profile's)."""
    check(profile)
    return [
        _run(
            profile,
            arm,
            k,
            anchor(profile, arm, k) * f / k,
            w,
            seed,
            weight_decay(profile, arm) * d,
        )
        for k in ks(profile, ks_)
        for arm in ARMS
        for f, w, d in grid.settings()
        for seed in grid.seeds
    ]


def finals(profile: Profile, chosen, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The chosen settings (:func:`choose`) with every seed: the chosen trial's keys exactly."""
    return [
        _run(profile, r.arm, r.k, r.base_lr, r.warmup_epochs, s, r.weight_decay)
        for r in chosen.itertuples()
        for s in seeds
    ]


# -- reading the runs ---------------------------------------------------------------------------


# what identifies a setting of one optimizer at one k (base_lr exactly as the trial's config has it)
SETTING = ["arm", "k", "batch_size", "base_lr", "warmup_epochs", "weight_decay"]


def arm_of(optimizer: str, nesterov: bool) -> str:
    return "nesterov" if optimizer == "sgd" and nesterov else optimizer


def prepare(df):
    """The runs as the study reads them: diverged runs at 100% error (test and validation), with
    their ``arm`` and ``peak_lr``."""
    df = studies.diverged_as_failed(df)
    df.loc[df["diverged"], VAL] = 100.0
    df["arm"] = [arm_of(o, n) for o, n in zip(df["optimizer"], df["nesterov"], strict=True)]
    df["peak_lr"] = df["lr"]  # as the run derived it: base_lr x k
    return df


def choose(trial_df):
    """Per optimizer and k, the setting of least validation error, the mean over its tuning
    seeds (ties: the smaller lr, then the shorter warmup): columns arm, k, peak_lr,
    warmup_epochs, the mean val error, where its lr sits on the grid (``lr_at_grid_edge``:
    :func:`lbsgd.lab.studies.rules.grid_edge`), the trials and tuning seeds it cost."""
    df = prepare(trial_df)
    mean = df.groupby([*SETTING, "peak_lr"], as_index=False)[VAL].mean()
    mean = mean.sort_values(["arm", "k", VAL, "peak_lr", "warmup_epochs"])
    best = mean.groupby(["arm", "k"], sort=False).head(1).copy()
    lrs = df.groupby(["arm", "k"])["peak_lr"].agg(lambda v: sorted(set(v)))
    # a grid of one or two lrs has no inside: every choice is on its edge
    edge = [(lrs.loc[(r.arm, r.k)], r.peak_lr) for r in best.itertuples()]
    best["lr_at_grid_edge"] = [studies.grid_edge(g, lr) if len(g) >= 3 else "low" for g, lr in edge]
    cost = df.groupby(["arm", "k"]).agg(
        trials=("run_dir", "count"), tuning_seeds=("seed", "nunique")
    )
    best = best.join(cost, on=["arm", "k"])
    cols = [*SETTING, "peak_lr", VAL, "lr_at_grid_edge", "trials", "tuning_seeds"]
    best = best.sort_values(["k", "arm"], key=_in_arms_order)
    return best[cols].reset_index(drop=True)


def grid_table(trial_df, profile: Profile):
    """Every setting's validation error, the mean and sd over its tuning seeds: per optimizer and
    k, its peak lr (and as a factor of the optimizer's centre there), warmup and weight decay,
    best first."""
    df = prepare(trial_df)
    df["factor"] = [
        round(lr / anchor(profile, a, k), 6)
        for lr, a, k in zip(df["peak_lr"], df["arm"], df["k"], strict=True)
    ]
    by = ["k", "arm", "peak_lr", "factor", "warmup_epochs", "weight_decay"]
    t = df.groupby(by)[VAL].agg(["mean", "std", "count"]).reset_index()
    t = t.rename(columns={"mean": f"{VAL}_mean", "std": f"{VAL}_std", "count": "tuning_seeds"})
    return t.sort_values(["k", "arm", f"{VAL}_mean"], key=_in_arms_order).reset_index(drop=True)


def _in_arms_order(column):
    """A sort key: the ``arm`` column in the order of :data:`ARMS`, any other as it is."""
    return column.map({a: i for i, a in enumerate(ARMS)}) if column.name == "arm" else column


def ours(final_df):
    """Test error of the chosen settings over the profile's seeds, per optimizer and k."""
    df = prepare(final_df)
    by = [*SETTING, "peak_lr"]
    return studies.summary(df, by)


def paper():
    """Nado et al. 2021's rows of the reference table (ResNet-50 at 32k), as error by optimizer."""
    import pandas as pd

    p = ex.reference(STUDY)
    p = p[p["metric"] == "top1_acc_pct"]
    return pd.DataFrame(
        {
            "arm": list(p["optimizer"]),
            "paper_batch": [int(b) for b in p["batch"]],
            "paper_top1_error_pct": [round(100 - v, 6) for v in p["value"]],
            "paper_source": [studies.cite(s) for s in p["source"]],
            "paper_variant": list(p["variant"]),
        }
    )


def parity_gaps(final_df):
    """At the largest k, per pair (:data:`PAIRS`): the plain optimizer's test error above the
    layer-wise one's, the mean of the paired (by seed) differences and their spread, beside the
    paper's (Nado et al.'s ResNet-50 at 32k, NaN where it publishes no number), in points."""
    import pandas as pd

    df = prepare(final_df)
    k = float(df["k"].max())
    published = paper().set_index("arm")["paper_top1_error_pct"].to_dict()
    rows = []
    for a, b in PAIRS:
        ea, eb = (studies.errors(df, arm=x, k=k) for x in (a, b))
        d = [y - x for x, y in zip(ea, eb, strict=True)]
        rows.append(
            {
                "pair": f"{_NAMES[b]} - {_NAMES[a]}",
                "ours": float(np.mean(d)),
                "ours_std": float(np.std(d, ddof=1)) if len(d) > 1 else math.nan,
                "paper": published.get(b, math.nan) - published.get(a, math.nan),
            }
        )
    return pd.DataFrame(rows)


def table(trial_df, final_df):
    """The chosen settings (validation error of the chosen trial) beside their test error over
    the profile's seeds, one row per optimizer and k; the paper's numbers beside the k that
    stands for its batch (k · 256)."""
    t = choose(trial_df).merge(ours(final_df), on=[*SETTING, "peak_lr"])
    t = t.merge(paper(), on="arm", how="left")
    same = [studies.paper_batch(k) == b for k, b in zip(t["k"], t["paper_batch"], strict=True)]
    for c in ("paper_batch", "paper_top1_error_pct", "paper_source", "paper_variant"):
        t.loc[[not x for x in same], c] = None
    return t.astype(dict.fromkeys(("trials", "runs", "diverged", "paper_batch"), "Int64"))


def budget(trial_df, final_df) -> str:
    """What the study spent: trials per optimizer and k, runs, and the minutes of run time."""
    df = prepare(trial_df)
    per = df.groupby(["arm", "k"]).size()
    settings = df.groupby(["arm", "k"])[["peak_lr", "warmup_epochs", "weight_decay"]]
    n = int(settings.apply(lambda g: len(g.drop_duplicates())).min())
    tuned = "peak lr, warmup" + (", weight decay" if df["weight_decay"].nunique() > 2 else "")
    seeds = df["seed"].nunique()
    minutes = (trial_df["wall_time_s"].sum() + final_df["wall_time_s"].sum()) / 60
    return (
        f"{per.min()} trials per optimizer and k ({n} settings of {tuned} x "
        f"{seeds} tuning seed{'s' if seeds > 1 else ''}) x "
        f"{df['arm'].nunique()} optimizers x {df['k'].nunique()} minibatches = {len(df)} tuning "
        f"runs, then {len(final_df)} runs of the chosen settings ({final_df['seed'].nunique()} "
        f"seeds); {minutes:.0f} minutes of run time in all ({len(df) + len(final_df)} runs)"
    )


# -- the findings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Regime:
    """What the claims say of the comparison: what the trials tuned (:func:`tuned_words`) and
    where the large batch lies against the profile's critical batch (``b_crit``, its
    ``Profile.b_crit``; None: not measured). Nado et al. and You et al. compare optimizers at
    batches beyond the critical batch; below it a claim says so and takes no side of theirs."""

    tuned: str = "lr- and warmup-tuned"
    b_crit: float | None = None

    def beyond(self, batch: float) -> bool:
        """At or above B_crit (or B_crit not measured: the papers' regime is assumed)."""
        return self.b_crit is None or batch >= self.b_crit

    def where(self, batch: float) -> str:
        """ "batch 256, below this profile's B_crit 504" (or "above")."""
        if self.b_crit is None:
            return f"batch {batch:g}"
        side = "at or above" if self.beyond(batch) else "below"
        return f"batch {batch:g}, {side} this profile's B_crit {self.b_crit:.0f}"


def tuned_words(trial_df) -> str:
    """ "lr-, warmup- and decay-tuned": the keys the trials varied for one optimizer."""
    df = prepare(trial_df)
    one = df[df["arm"] == df["arm"].iloc[0]]
    varied = [
        word
        for word, key in (("lr", "peak_lr"), ("warmup", "warmup_epochs"), ("decay", "weight_decay"))
        if one[key].nunique() > 1
    ]
    if len(varied) < 2:
        return f"{varied[0] if varied else 'lr'}-tuned"
    return ", ".join(f"{w}-" for w in varied[:-1]) + f" and {varied[-1]}-tuned"


BELOW = (
    "none at this batch: Nado et al. (ResNet-50 at 32k) and You et al. compare optimizers beyond "
    "the critical batch"
)


def findings(final_df, chosen=None, regime: Regime = Regime()) -> list[Finding]:
    """At the largest k: LARS against tuned Nesterov, LAMB against tuned AdamW, each one claim
    with three outcomes (beats, matches, loses: :func:`lbsgd.lab.findings.contrast`); from the
    smallest k to the largest: does each layer-wise optimizer lose less than its plain one.
    Paired over seeds. ``chosen`` (:func:`choose`): a claim that reads an optimizer whose chosen
    lr sits on an edge of its grid is invalid (the grid did not bracket its best lr: no tuned
    arm). ``regime``: the claims' words (what was tuned, the batch beside B_crit)."""
    df = prepare(final_df)
    chance = studies.chance_of(df)
    kmin, kmax = float(df["k"].min()), float(df["k"].max())
    claims = [([kmax], _contrast(df, a, b, kmax, chance, regime), (a, b)) for a, b in PAIRS]
    if kmin < kmax:
        ks_ = [kmin, kmax]
        claims += [(ks_, _loses_less(df, a, b, ks_, chance, regime), (a, b)) for a, b in PAIRS]
    return [
        replace(_untuned(f, chosen, arms, on), budget=studies.budget(df, on, _paper_run(kmax)))
        for on, f, arms in claims
    ]


def _untuned(f: Finding, chosen, arms: Sequence[str], ks_: Sequence[float]) -> Finding:
    """``f`` made invalid when one of ``arms`` at one of ``ks_`` chose an lr on its grid's edge
    (``chosen``: :func:`choose`; None: not checked)."""
    if chosen is None or f.invalid:
        return f
    for arm in arms:
        for k in ks_:
            r = chosen[(chosen["arm"] == arm) & (chosen["k"] == k)]
            edge = r["lr_at_grid_edge"].iloc[0] if len(r) else ""
            if edge:
                # study 14's grid names a side of its lrs, study 17's search the axis too
                what, of = ("setting", "search") if " " in edge else ("lr", "grid")
                where = f"{what} at k={k:g} sits on the {edge} edge of its {of}"
                return void(f, f"{_NAMES[arm]}'s chosen {where}: no tuned arm")
    return f


def void(f: Finding, why: str) -> Finding:
    """``f`` made invalid for ``why``; its test stays in the evidence (as an invalid verdict's
    does), not its reason."""
    evidence = f"{f.evidence.split('; undecided: ')[0]}; invalid: {why}"
    return replace(f, replayed=None, invalid=True, p_for=None, p_against=None, evidence=evidence)


# Nado et al. 2021's parity margin, in points of top-1 error: their tuned Nesterov reaches
# LARS's 75.9% at 32k (a gap of 0 within their seed spread of ~0.1-0.3); ±1.0 point, the
# closeness margin of the other studies, would reject Goyal's own no-warmup run (+1.24)
PARITY_PTS = 1.0
NADO_STEPS = "Nado et al.'s ResNet-50 at 32k: 2,512"
NADO_BATCH = 32768  # k = 128 by k · 256


def _paper_run(k: float) -> str | None:
    """The paper's run a claim's budget names: Nado et al.'s where its largest k stands for their
    32k; else None, Goyal's at the batch k stands for (:func:`lbsgd.lab.studies.budget`)."""
    return NADO_STEPS if studies.paper_batch(k) == NADO_BATCH else None


def _contrast(
    df, a: str, b: str, k: float, chance: float | None, regime: Regime, expect: str = "matches"
) -> Finding:
    """At the largest k the layer-wise ``a`` against the tuned plain ``b``, one claim: Nado et
    al.'s parity (matches within ±PARITY_PTS), against You et al.'s "beats" or a loss (paired
    over seeds); ``expect="beats"``: You et al.'s claim, against parity or a loss."""
    ea, eb = (studies.errors(df, arm=x, k=k) for x in (a, b))
    na, nb = _NAMES[a], _NAMES[b]
    v = studies.contrast(
        ea, eb, margin=PARITY_PTS, expect=expect, names=(na, nb), chance=chance, paired=True
    )
    wins = sum(x < y for x, y in zip(ea, eb, strict=True))
    batch = float(df[df["k"] == k]["batch_size"].iloc[0])
    beyond = regime.beyond(batch)
    parity = ": Nado et al.'s parity" if beyond else ""
    claim = (
        f"{regime.tuned} {nb} matches {na} (within ±{PARITY_PTS:g} point{parity})"
        if expect == "matches"
        else f"{na} beats {regime.tuned} {nb} ({_CLAIMED[a]})"
    )
    return studies.finding(
        f"at {regime.where(batch)}, {claim}",
        v,
        f"k={k:g}: {na} {studies.mean(ea):.1f}% vs {nb} {studies.mean(eb):.1f}% test error (mean "
        f"over {len(ea)} seeds; {na} better in {wins} of {len(ea)}); chosen on held-out images: "
        f"{na} {_chosen(df, a, k)}, {nb} {_chosen(df, b, k)}",
        paper=_PAPER[a] if beyond else BELOW,
    )


_NAMES = {"nesterov": "Nesterov", "lars": "LARS", "lamb": "LAMB", "adamw": "AdamW"}
# who claims the layer-wise optimizer wins, and who answers (Nado et al. 2021)
_CLAIMED = {"lars": "You et al. 2017", "lamb": "You et al. 2019"}
_PAPER = {
    "lars": "Nado et al. 2021 (matches): tuned Nesterov reaches LARS's published ResNet-50 "
    "result at 32k (75.9% top-1 in 2,512 steps); You et al. 2017 (LARS beats it): LARS keeps "
    "AlexNet-BN and ResNet-50 accuracy where SGD loses it",
    "lamb": "Nado et al. 2021 (matches): tuned Adam matches LAMB on BERT pre-training at LAMB's "
    "batch sizes; You et al. 2019 (LAMB beats it): LAMB trains BERT at batch 32k/64k in 76 "
    "minutes",
}


def supports(replayed: bool | None, layerwise: str, invalid: bool = False) -> str:
    """Which paper a verdict on "the layer-wise optimizer wins" supports (neither when it is
    undecided or ``invalid``)."""
    if invalid or replayed is None:
        return f"supports neither paper ({'invalid' if invalid else 'undecided'})"
    return f"supports {_CLAIMED[layerwise]}" if replayed else "supports Nado et al. 2021"


def _chosen(df, arm: str, k: float) -> str:
    r = df[(df["arm"] == arm) & (df["k"] == k)].iloc[0]
    return f"lr {r['peak_lr']:.3g}, warmup {r['warmup_epochs']:g} ep, weight decay {r['weight_decay']:.3g}"


def _loses_less(df, a: str, b: str, ks_, chance: float | None, regime: Regime) -> Finding:
    """From the smallest k to the largest (``ks_``), ``a``'s test error grows less than ``b``'s."""
    kmin, kmax = ks_
    e = {(arm, k): studies.errors(df, arm=arm, k=k) for arm in (a, b) for k in ks_}
    # each seed's test error at kmax less its own at kmin
    la, lb = ([y - x for x, y in zip(e[arm, kmin], e[arm, kmax], strict=True)] for arm in (a, b))
    failed = [f"{arm} k={k:g}: {why}" for (arm, k), v in e.items() if (why := untrained(v, chance))]
    if failed:
        v = studies.Verdict(None, f"an arm did not train ({failed[0]})", invalid=True)
    else:
        v = studies.lower(la, lb, paired=True)
    batch = float(df[df["k"] == kmax]["batch_size"].iloc[0])
    beyond = regime.beyond(batch)
    return studies.finding(
        f"from k={kmin:g} to k={kmax:g} ({regime.where(batch)}) {_NAMES[a]} loses less accuracy "
        f"than {regime.tuned} {_NAMES[b]}",
        v,
        f"test error change: {_NAMES[a]} {studies.mean(la):+.1f} points, {_NAMES[b]} "
        f"{studies.mean(lb):+.1f} points (mean over {len(la)} seed(s), each optimizer tuned at "
        f"both k)" + (f"; {supports(v.replayed, a, v.invalid)}" if beyond else ""),
        paper=_PAPER[a] if beyond else BELOW,
    )
