"""13. Stale gradients: error vs staleness τ, with and without the linear scaling rule, and a
genuinely asynchronous parameter server beside the simulation.

The simulation (``staleness`` = τ, ``staleness_dist=fixed``) applies at step t the gradient of
step t's batch on the weights of step t − τ (Lian et al. 2015), deterministic on one process, so τ
is the only difference between the arms; each τ runs with ``lr_scaling=linear`` and ``none``. The
parameter server (``async_ps=true``) is compared with the simulated run at the integer nearest its
measured mean staleness (trained when not in the list); its runs do not repeat or resume and run
one at a time, so that no other run changes their timing. Both: docs/communication.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lbsgd import config, rundir
from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import Verdict, mean
from lbsgd.lab.studies.scales import Profile

STUDY = "staleness"
TITLE = "13. Stale gradients: simulated staleness and an asynchronous parameter server (Lian et al. 2015, Zhang et al. 2016)"
TAUS = (0, 1, 2, 4, 8)
RULES = ("linear", "none")
PS_WORKERS = 2  # K workers of the parameter server (K + 1 processes)
# "near": the PS run's error within this many points of the simulated run's, either way (about the
# seed spread at the cpu profile's large_k, notebook 3: 1-2 points)
NEAR_PTS = 1.0
# the two lr rules' arms compare their growth with τ only when both train: their errors at τ = 0
# within this many points (else one arm is undertrained and its flat curve says nothing)
BASE_GAP_PTS = 10.0
STALENESS_MEAN = "async_ps_staleness_mean"  # summary.json's async_ps.staleness.mean, flattened
# What the papers say of each finding (its ``paper`` field): they give bounds and rules, no error
# by staleness.
LIAN = (
    "Lian et al. 2015: qualitative, convergence needs a step size that shrinks as the staleness "
    "bound grows; no number in the reference data"
)
LIAN_ZHANG = (
    "Lian et al. 2015, Zhang et al. 2016: qualitative, the step size bounded by the staleness "
    "(Lian) or divided by it, η/τ (Zhang); no number in the reference data"
)
PS_AGAINST_SIM = (
    "no published number: lbsgd's parameter server against its own simulation of staleness"
)


# -- the runs ----------------------------------------------------------------------------------


def batch_k(profile: Profile, k: float | None = None) -> float:
    """The study's fixed batch as k: ``k`` or the profile's ``large_k`` (cpu: 16, batch 256, lr
    0.2 with the linear rule vs 0.0125 without; at k = 1 the two arms would be the same runs)."""
    return profile.large_k if k is None else k


def runs(
    profile: Profile,
    seeds: Sequence[int],
    taus: Sequence[int] = TAUS,
    rules: Sequence[str] = RULES,
    k: float | None = None,
) -> list[dict[str, Any]]:
    """The simulated runs: each lr rule, τ and seed at the fixed batch, ``staleness_dist=fixed``
    (τ = 0 is synchronous SGD: with the linear rule, notebook 3's run at that k)."""
    out = []
    for rule in rules:
        for tau in taus:
            for s in seeds:
                keys = profile.keys(k=batch_k(profile, k), seed=s, lr_scaling=rule)
                out.append({**keys, "staleness": int(tau), "staleness_dist": "fixed"})
    return out


def ps_runs(
    profile: Profile, seeds: Sequence[int], workers: int = PS_WORKERS, k: float | None = None
) -> list[dict[str, Any]]:
    """The parameter-server runs, one per seed, with the profile's lr rule, named
    ``<run>-ps<workers>`` (the worker count is no experiment key, yet sets the staleness);
    ``resume=false`` (async_ps cannot resume)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise config.ConfigError(f"workers={workers!r} must be an integer >= 1 (K workers)")
    out = []
    for s in seeds:
        keys = {**profile.keys(k=batch_k(profile, k), seed=s), "async_ps": True}
        name = f"{config.from_dict(keys).run_name()}-ps{workers}"
        out.append({**keys, "name": name, "resume": False})
    return out


def ps_sweep(S, runs: Sequence[Mapping[str, Any]], workers: int):
    """The PS runs on ``workers`` + 1 processes, one at a time; a run already finished is loaded,
    not started again (``resume=false``: the sweep would refuse its folder)."""
    import pandas as pd

    todo, done = [], []
    for r in runs:
        cfg = config.from_dict({**r, "study": S.study, "out_dir": str(S.out)})
        status = rundir.read_status(cfg.run_dir())
        if status in ex.DONE:
            print(
                f"[{len(done) + 1}/{len(runs)}] {cfg.run_name()}: already {status}, skipped",
                flush=True,
            )
            done.append(cfg.run_name())
        else:
            todo.append(r)
    frames = [ex.load_runs(S.dir, names=done)] if done else []
    if todo:
        frames.append(
            ex.sweep(
                S.study,
                todo,
                out_dir=S.out,
                profile=S.profile.name,
                **{**S.launch, "nproc_per_node": workers + 1, "parallel": 1},
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def matched_tau(ps) -> int:
    """The simulated τ that matches the PS runs: the nearest integer to their mean measured
    staleness (mean over runs of each run's mean)."""
    return int(round(mean([float(v) for v in ps[STALENESS_MEAN]])))


# -- the table ---------------------------------------------------------------------------------


def table(sim, ps=None):
    """Per lr rule and τ: runs, the error (mean, std), diverged runs, the peak lr; the PS runs as
    mode ``async_ps`` at their mean measured staleness (one row); ``paper_lr_factor``: Zhang et al.'s
    staleness-aware lr factor 1/τ (1 at τ = 0) beside ``lr_factor``, the factor the rule applied."""
    import pandas as pd

    sim = studies.diverged_as_failed(sim).assign(mode="simulated")
    parts = [sim]
    if ps is not None and len(ps):
        # one row: at the mean over the runs of each run's mean measured staleness
        tau = mean([float(v) for v in ps[STALENESS_MEAN]])
        ps = studies.diverged_as_failed(ps).assign(mode="async_ps", staleness=tau)
        parts.append(ps)
    m = pd.concat(parts, ignore_index=True)
    t = ex.summarize(m, ["mode", "lr_scaling", "staleness"])
    g = m.groupby(["mode", "lr_scaling", "staleness"], sort=True, dropna=False)
    t["diverged"] = g["diverged"].sum().to_numpy()
    t["peak_lr"] = g["lr"].first().to_numpy() if "lr" in m else math.nan  # derived: the peak lr
    t["lr_factor"] = g["k"].first().to_numpy()
    t.loc[t["lr_scaling"] == "none", "lr_factor"] = 1.0
    t["paper_lr_factor"] = [1.0 / max(float(x), 1.0) for x in t["staleness"]]
    return t.sort_values(
        ["mode", "lr_scaling", "staleness"], ascending=[False, True, True], ignore_index=True
    )


# -- the findings ------------------------------------------------------------------------------


def _by_seed(df, **where: Any) -> dict[int, float]:
    sel = df
    for key, v in where.items():
        sel = sel[sel[key] == v]
    return {int(s): float(e) for s, e in zip(sel["seed"], sel["final_top1_error_pct"], strict=True)}


def _curve(sim, rule: str) -> str:
    taus = sorted({int(t) for t in sim[sim["lr_scaling"] == rule]["staleness"]})
    return ", ".join(
        f"τ={t}: {mean(list(_by_seed(sim, lr_scaling=rule, staleness=t).values())):.2f}%"
        for t in taus
    )


def _growth(sim, rule: str, top: int) -> dict[int, float]:
    """Per seed: error at τ = ``top`` minus error at τ = 0."""
    a, b = (
        _by_seed(sim, lr_scaling=rule, staleness=top),
        _by_seed(sim, lr_scaling=rule, staleness=0),
    )
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def findings(sim, ps=None) -> list[Finding]:
    """From the simulated runs ``sim`` (:func:`runs`) and the PS runs ``ps`` (:func:`ps_runs`; their
    matched simulated runs belong in ``sim``):

    1. the error grows with τ: with the linear rule, the largest τ's error is above τ = 0's
       (paired over seeds; a diverged run counts as 100%);
    2. the linear rule makes staleness worse: the per-seed growth from τ = 0 to the largest τ is
       larger with ``lr_scaling=linear`` than with ``none`` (paired);
    3. the PS runs' error lies within :data:`NEAR_PTS` points of the simulated run's at τ = their
       rounded mean staleness (same seeds, linear rule; paired), either way.
    """
    sim = studies.diverged_as_failed(sim)
    rules = sorted(set(sim["lr_scaling"]))
    lin = "linear" if "linear" in rules else rules[0]  # the lr rule of claims 1 and 3
    chance, top = studies.chance_of(sim), max(int(t) for t in sim["staleness"])
    return [
        _error_grows(sim, chance, top, lin),
        _linear_amplifies(sim, chance, top),
        _server_beside_simulation(sim, ps, chance, lin),
    ]


def _error_grows(sim, chance: float | None, top: int, lin: str) -> Finding:
    """Claim 1: the error grows with τ (linear rule)."""
    rules = sorted(set(sim["lr_scaling"]))
    curves = "; ".join(f"{r}: {_curve(sim, r)}" for r in rules)
    div = int(sim["diverged"].sum())
    div_txt = f"; {div} diverged run(s) counted as 100%" if div else ""
    a, b = _by_seed(sim, lr_scaling=lin, staleness=0), _by_seed(sim, lr_scaling=lin, staleness=top)
    # paired by seed when the arms share two seeds or more, else each arm whole (Welch's interval)
    common = sorted(set(a) & set(b))
    paired = len(common) >= 2
    e0 = [a[s] for s in common] if paired else list(a.values())
    et = [b[s] for s in common] if paired else list(b.values())
    if top == 0 or not e0 or not et:
        v1 = Verdict(None, "no run at τ = 0 and at a τ > 0")
    else:
        v1 = studies.lower(e0, et, chance=chance, paired=paired)
    note1 = studies.note(
        v1,
        bool(e0 and et) and mean(et) <= mean(e0),
        f"τ = {top} steps is a small share of the run's steps at this lr; the "
        "stale gradient points almost where the fresh one does",
    )
    return studies.finding(
        f"the error grows with the staleness τ (lr_scaling={lin}, τ = 0 vs {top})",
        v1,
        curves + div_txt + note1,
        paper=LIAN,
    )


def _linear_amplifies(sim, chance: float | None, top: int) -> Finding:
    """Claim 2: the linear rule amplifies staleness (per-seed growth, linear vs none)."""
    g_lin, g_none = _growth(sim, "linear", top), _growth(sim, "none", top)
    seeds = sorted(set(g_lin) & set(g_none))
    if top == 0 or not seeds:
        v2 = Verdict(None, "the linear and none arms have no common seed at τ = 0 and a τ > 0")
        ev2 = "no paired runs"
    else:
        x, y = [g_lin[s] for s in seeds], [g_none[s] for s in seeds]
        # invalid when every run is at chance or the arms already differ at τ = 0
        base = {
            r: mean(list(_by_seed(sim, lr_scaling=r, staleness=0).values()))
            for r in ("linear", "none")
        }
        if studies.at_chance(list(sim["final_top1_error_pct"]), chance):
            v2 = Verdict(None, f"every run is at chance ({chance:.0f}% error)", invalid=True)
        elif abs(base["linear"] - base["none"]) > BASE_GAP_PTS:
            v2 = Verdict(
                None,
                (
                    f"at τ = 0 the arms already differ by {abs(base['linear'] - base['none']):.1f} "
                    f"points (linear {base['linear']:.1f}%, none {base['none']:.1f}%): one of them "
                    "hardly trains in this budget, so their growths do not compare"
                ),
                invalid=True,
            )
        else:  # growth with the linear rule above growth without, paired over seeds
            v2 = studies.verdict(x, y, more_than=0.0, paired=True)
        ev2 = (
            f"error growth from τ = 0 to τ = {top}, per seed: linear "
            f"{', '.join(f'{v:+.2f}' for v in x)}, none {', '.join(f'{v:+.2f}' for v in y)} "
            f"points (means {mean(x):+.2f} vs {mean(y):+.2f})"
        )
        ev2 += studies.note(
            v2,
            mean(x) <= mean(y),
            "the larger lr of the linear rule does not "
            "turn these few steps of delay into a larger loss",
        )
    return studies.finding(
        "the linear scaling rule makes stale gradients worse (a larger lr amplifies staleness; Lian "
        "et al. 2015 bound the step size by the staleness, Zhang et al. 2016 scale it by 1/τ)",
        v2,
        ev2,
        paper=LIAN_ZHANG,
    )


def _server_beside_simulation(sim, ps, chance: float | None, lin: str) -> Finding:
    """Claim 3: the PS mode beside the simulation at its mean staleness."""
    claim3 = (
        f"the asynchronous parameter server's error lies within {NEAR_PTS:g} point of the "
        "simulated run at its mean measured staleness"
    )
    if ps is None or not len(ps):
        return studies.finding(
            claim3, Verdict(None, "no parameter-server run"), "none", paper=PS_AGAINST_SIM
        )
    ps = studies.diverged_as_failed(ps)
    tau = matched_tau(ps)
    a = _by_seed(ps)
    b = _by_seed(sim, lr_scaling=lin, staleness=tau)
    common = sorted(set(a) & set(b))
    means = [float(v) for v in ps[STALENESS_MEAN]]
    workers = int(ps["async_ps_workers"].iloc[0]) if "async_ps_workers" in ps else None
    head = (
        f"{workers} workers; measured mean staleness per run {', '.join(f'{v:.2f}' for v in means)} "
        f"→ τ = {tau}"
    )
    if not common:
        return studies.finding(
            claim3,
            Verdict(None, f"no simulated run at τ = {tau} with the PS runs' seeds"),
            head,
            paper=PS_AGAINST_SIM,
        )
    x, y = [a[s] for s in common], [b[s] for s in common]
    v3 = studies.within(x, y, NEAR_PTS, chance=chance, paired=True)
    ev3 = (
        f"{head}: PS {mean(x):.2f}% vs simulated {mean(y):.2f}% (seeds "
        f"{', '.join(map(str, common))}; Δ {mean(x) - mean(y):+.2f} points)"
    )
    ev3 += studies.note(
        v3,
        abs(mean(x) - mean(y)) > NEAR_PTS,
        "the server's staleness is a "
        "distribution (its histogram in summary.json), the simulation's a single τ; "
        "and the server applies the gradients in arrival order",
    )
    return studies.finding(claim3, v3, ev3, paper=PS_AGAINST_SIM)
