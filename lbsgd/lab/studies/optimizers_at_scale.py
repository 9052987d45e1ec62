"""17. Study 14 where its papers make their claims: the four optimizers beyond the critical batch,
pre-registered (docs/studies.md, "Study 17"; the design, seeds and decision rule were committed
before its runs). Per optimizer at one large k: an lr range test centres its search; a
successive-halving quasi-random search over lr, warmup and weight decay on held-out images,
extended once toward an edge its choice sits on; the choice trained on fresh measuring seeds;
Nado et al.'s and You et al.'s claims decided by one three-outcome contrast each
(:func:`lbsgd.lab.findings.contrast`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lbsgd import config
from lbsgd.config import ConfigError
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import optimizers as opt
from lbsgd.lab.studies.scales import Profile

STUDY = "optimizers_at_scale"
TITLE = "17. Large-batch optimizers beyond the critical batch, pre-registered (Nado et al. 2021)"
EDGE = 1 / 8  # a choice in the outer eighth of an axis's range sits on its edge
BUDGET_H = 12.0  # the new runs' run time (hours) past which an extended search voids its claims


@dataclass(frozen=True)
class AtScale:
    """The pre-registered design at one profile (docs/studies.md, "Study 17")."""

    k: float  # the large minibatch, as k
    keys: Mapping[str, Any]  # every run's keys over the profile's (data, length)
    holdout: int  # training images held out: the trials are judged on them
    points: int  # Halton points of the first rung (one tuning seed each)
    keep: tuple[int, ...]  # the best points kept for each further rung (its next tuning seed)
    tuning_seeds: tuple[int, ...]
    seeds: tuple[int, ...]  # the measuring seeds of each optimizer's choice
    range_seed: int  # the range tests' seed
    max_warmup: float  # the warmup axis, 0 to this (epochs)
    extension: tuple[int, ...] = (6, 2, 1)  # an edge's search: its points, then those kept
    # the budget's price of a step: the 230 s of a 430-step run two at a time on an idle machine
    step_s: float = 230 / 430
    octaves: float = 2.0  # lr and weight decay: log-uniform over x2^±octaves of the centre
    ramp: tuple[float, float] = (1 / 16, 4.0)  # range test: from/to these times the rule's lr
    ladder: dict = field(default_factory=dict)


SETTINGS = {
    # k = 64: batch 1,024, 2.8 x B_crit 364; 55,000 training images x 8 epochs = 430 steps,
    # 4.6 x S_min 94 (study 15). 12 points -> 4 -> 2 over seeds 5100-5102 (72 trials), 20
    # measuring seeds 5000-5019 (80 runs), range tests on 5200: 156 runs, about 10 h of run time
    # at the 230 s of the warmup study's batch-1,024 runs. Seeds 5000-5200 used nowhere else.
    "fashion-long": AtScale(
        k=64,
        keys={"fashion_train": 60_000, "epochs": 8},
        holdout=5_000,
        points=12,
        keep=(4, 2),
        tuning_seeds=(5100, 5101, 5102),
        seeds=tuple(range(5000, 5020)),
        range_seed=5200,
        max_warmup=4.0,
    ),
    # the tests' scale: every cell runs, in seconds
    "smoke": AtScale(
        k=8,
        keys={"epochs": 1},
        holdout=128,
        points=2,
        keep=(1,),
        tuning_seeds=(1000, 1001),
        seeds=(0, 1),
        range_seed=1000,
        max_warmup=0.5,
        extension=(2, 1),
    ),
}


def design(profile: Profile) -> AtScale:
    """The profile's design; one line naming the profiles that have one."""
    if profile.name not in SETTINGS:
        raise ConfigError(
            f"profile={profile.name!r} has no settings for study 17 (valid: {', '.join(SETTINGS)})"
        )
    return SETTINGS[profile.name]


def scaled(profile: Profile, centres: Mapping[str, float] | None = None) -> Profile:
    """``profile`` as study 14's functions read it at the design's k: its keys, held-out images,
    measuring seeds and each optimizer's centre (the range tests')."""
    a = design(profile)
    tuning = {**opt.settings(profile), "holdout": a.holdout, "keys": dict(a.keys)}
    tuning["centres"] = {a.k: dict(centres or {})}
    return opt.Tuned.of(profile, tuning, ks={"optimizers": (a.k,)}, seeds=a.seeds)


def range_tests(profile: Profile) -> list[dict]:
    """One lr range test per optimizer at the design's batch (:mod:`lbsgd.plan.lr_range`): its
    lr rising linearly from ``ramp[0]`` to ``ramp[1]`` times the optimizer's rule lr at k."""
    from lbsgd.plan import lr_range

    a, p = design(profile), scaled(profile)
    runs = []
    for arm in opt.ARMS:
        rule = opt.anchor(p, arm, a.k)
        keys = opt._run(p, arm, a.k, rule / a.k, 0.0, a.range_seed)
        ramp = lr_range.keys(
            config.from_dict(keys), keys["batch_size"], *(rule * r for r in a.ramp)
        )
        runs.append({**keys, **ramp})
    return runs


def centres(range_df) -> dict[str, float]:
    """Each optimizer's centre: half the lr where its range test's loss stopped falling (the
    ramp's top when it never did), as pre-registered."""
    from lbsgd.plan import lr_range

    out = {}
    for r in opt.prepare(range_df).itertuples():
        t = lr_range.read(r.run_dir)
        out[r.arm] = opt._digits((t.bound if t.bound is not None else t.high) / 2)
    return out


def points(a: AtScale, edge: str = "") -> list[tuple[float, float, float]]:
    """The search's points; toward ``edge`` (e.g. "high lr"), the extension's: the first
    ``extension[0]`` of the same sequence over the box moved one range width that way."""
    if not edge:
        return opt.Search(a.points, a.octaves, a.max_warmup, a.octaves).settings()
    side, axis = edge.split(" ", 1)
    i = ("lr", "warmup", "weight decay").index(axis)
    sign = 1 if side == "high" else -1
    out = []
    for pt in opt.Search(a.extension[0], a.octaves, a.max_warmup, a.octaves).settings():
        x = list(pt)
        x[i] = x[i] + a.max_warmup if i == 1 else x[i] * 2.0 ** (sign * 2 * a.octaves)
        out.append(tuple(x))
    return out


def halving(
    profile: Profile,
    centres_: Mapping[str, float],
    done,
    rung: int,
    edges: Mapping[str, str] | None = None,
):
    """The trials of rungs 0..``rung``: rung 0 every point on the first tuning seed; rung r the
    ``keep[r-1]`` best of rung r-1's points per optimizer (mean held-out error over the seeds
    they had) on seed r. ``done``: the trials of rungs before ``rung`` (None at rung 0).
    ``edges`` ({optimizer: edge}, :func:`edges`): the extension's rungs, those optimizers alone
    over their moved boxes, ``extension`` points then those kept."""
    a, p = design(profile), scaled(profile, centres_)
    keep = a.keep if edges is None else a.extension[1:]
    runs = []
    for arm in opt.ARMS if edges is None else [x for x in opt.ARMS if x in edges]:
        kept = points(a, (edges or {}).get(arm, ""))
        for r in range(rung + 1):
            if r:
                kept = _best(p, arm, kept, done, keep[r - 1], a.tuning_seeds[:r])
            runs += [_trial(p, arm, point, a.tuning_seeds[r]) for point in kept]
    return runs


def _trial(p: Profile, arm: str, point: tuple[float, float, float], seed: int) -> dict:
    f, w, d = point
    k = p.ks["optimizers"][0]
    return opt._run(p, arm, k, opt.anchor(p, arm, k) * f / k, w, seed, opt.weight_decay(p, arm) * d)


def _best(p: Profile, arm: str, points, done, n: int, seeds) -> list[tuple[float, float, float]]:
    """The ``n`` of ``points`` of least mean held-out error on ``arm``'s trials in ``done`` on
    ``seeds`` (the rungs before: a later rung's seeds never re-rank an earlier one)."""
    df = opt.prepare(done)
    df = df[(df["arm"] == arm) & df["seed"].isin(seeds)]

    def error(point) -> float:
        t = _trial(p, arm, point, 0)
        same = df[
            (df["base_lr"] == t["base_lr"])
            & (df["warmup_epochs"] == t["warmup_epochs"])
            & (df["weight_decay"] == t["weight_decay"])
        ]
        return float(same[opt.VAL].mean()) if len(same) else math.inf

    return sorted(points, key=lambda pt: (error(pt), pt))[:n]


def choose(trial_df, profile: Profile, centres_: Mapping[str, float], edges=None):
    """Study 14's choice (:func:`lbsgd.lab.studies.optimizers.choose`) among the points every tuning
    seed trained, each marked where it sits on an edge of its search (``lr_at_grid_edge``: the
    axis and side, e.g. "high warmup"; "" inside); ``edges``: the searches extended, whose box
    reaches one range width further on that side."""
    a = design(profile)
    df = opt.prepare(trial_df)
    full = df.groupby(["arm", *opt.SETTING[2:]])["seed"].transform("nunique") == len(a.tuning_seeds)
    chosen = opt.choose(trial_df[full.to_numpy()])
    chosen["trials"] = df.groupby("arm").size().reindex(chosen["arm"]).to_numpy()
    p = scaled(profile, centres_)
    chosen["lr_at_grid_edge"] = [
        edge_of(
            a,
            r.peak_lr / opt.anchor(p, r.arm, a.k),
            r.warmup_epochs,
            r.weight_decay / opt.weight_decay(p, r.arm),
            (edges or {}).get(r.arm, ""),
        )
        for r in chosen.itertuples()
    ]
    chosen["extended"] = [(edges or {}).get(arm, "") for arm in chosen["arm"]]
    return chosen


def edge_of(a: AtScale, lr: float, warmup: float, decay: float, moved: str = "") -> str:
    """Where a chosen point sits on an edge of the search box: "high lr", "low weight decay",
    "high warmup" (warmup's low end, 0, is no edge), or ""; the box reaches one range width
    further on the side ``moved``."""
    span, width = 2 * a.octaves * EDGE, 2 * a.octaves
    for axis, x in (("lr", lr), ("weight decay", decay)):
        if math.log2(x) > a.octaves + width * (moved == f"high {axis}") - span:
            return f"high {axis}"
        if math.log2(x) < span - a.octaves - width * (moved == f"low {axis}"):
            return f"low {axis}"
    top = a.max_warmup * (1 + (moved == "high warmup"))
    return "high warmup" if warmup > top - a.max_warmup * EDGE else ""


def edges(chosen) -> dict[str, str]:
    """{optimizer: the edge its choice sits on}, for those on one: the searches to extend."""
    return {r.arm: r.lr_at_grid_edge for r in chosen.itertuples() if r.lr_at_grid_edge}


def finals(profile: Profile, chosen) -> list[dict]:
    """Each optimizer's choice on every measuring seed."""
    return opt.finals(scaled(profile), chosen, design(profile).seeds)


def table(final_df):
    """Each choice's test error over the measuring seeds, Nado et al.'s published rows beside the
    k that stands for their batch (k · 256; none at k = 64, their 32k is k = 128)."""
    t = opt.ours(final_df).merge(opt.paper(), on="arm", how="left")
    same = [studies.paper_batch(k) == b for k, b in zip(t["k"], t["paper_batch"], strict=True)]
    for c in ("paper_batch", "paper_top1_error_pct", "paper_source", "paper_variant"):
        t.loc[[not x for x in same], c] = None
    return t


def findings(final_df, chosen, regime: opt.Regime, hours=0.0, recorded=0.0) -> list[Finding]:
    """Nado et al.'s parity (tuned Nesterov matches LARS within ±1 point) and You et al.'s claim
    (LAMB beats tuned AdamW), each one contrast with three outcomes, paired over the measuring
    seeds; invalid where an optimizer's choice sits on an edge of its search, or its search was
    extended and the new runs took more than :data:`BUDGET_H` as priced (``hours``; their
    ``recorded`` wall time said beside where only that passes it: :func:`hours`)."""
    df = opt.prepare(final_df)
    chance = studies.chance_of(df)
    k = float(df["k"].max())
    budget = studies.budget(df, [k], opt._paper_run(k))
    extended = {r.arm for r in chosen.itertuples() if r.extended}
    out = []
    for (a, b), expect in zip(opt.PAIRS, ("matches", "beats"), strict=True):
        f = opt._untuned(
            opt._contrast(df, a, b, k, chance, regime, expect=expect), chosen, (a, b), [k]
        )
        if (ext := sorted(extended & {a, b})) and not f.invalid:
            took = f"the search of {' and '.join(ext)} was extended and the new runs took"
            if hours > BUDGET_H:
                f = opt.void(f, f"{took} {hours:.1f} h, past the pre-registered {BUDGET_H:g} h")
            elif recorded > BUDGET_H:
                read = f"{hours:.1f} h as priced, {recorded:.1f} h as recorded on a shared machine"
                f = dataclasses.replace(
                    f, evidence=f"{f.evidence}; {took} {read} (read that way: invalid)"
                )
        out.append(dataclasses.replace(f, budget=budget))
    return out


def hours(profile: Profile, *dfs, recorded: bool = False) -> float:
    """The runs' run time in hours as the design prices it: every step trained at ``step_s``;
    ``recorded``: their wall time as recorded instead, every attempt counted."""
    if recorded:
        return sum(float(d["total_wall_time_s"].sum()) for d in dfs) / 3600
    return design(profile).step_s * sum(float(d["steps"].sum()) for d in dfs) / 3600


def budget(profile: Profile, range_df, trial_df, final_df) -> str:
    """What the study spent: runs of each kind and their hours of run time."""
    parts = {"range tests": range_df, "tuning trials": trial_df, "measuring runs": final_df}
    runs = ", ".join(f"{len(d)} {name}" for name, d in parts.items())
    priced, wall = hours(profile, *parts.values()), hours(profile, *parts.values(), recorded=True)
    return f"{runs}; {priced:.1f} hours of run time as priced ({wall:.1f} as recorded)"
