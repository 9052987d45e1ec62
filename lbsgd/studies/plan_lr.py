"""Study 16, part two: every row of a plan at the plan's own lr, on networks it was not tuned to.

Per network of :data:`SETTINGS`: one probe, ``lbsgd plan``'s rows from it (its lr range
test capping the lrs), every planned batch up to :data:`CHECKED_UP_TO` × B_crit trained at the
row's lr and warmup on fresh seeds, stopped at the target (capped at :data:`CAP` × the row's
epochs), and two claims: predicted steps within 25% of the measured below B_crit, within 50%
above, by each batch's jackknife-t interval. Pre-registered: its claims, bands, seeds and cap are
not to change; the record and results are docs/planning.md ("At the plan's own lr").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lbsgd import plan as planner
from lbsgd import stats, studies
from lbsgd.config import ConfigError, from_dict
from lbsgd.findings import Finding
from lbsgd.plan import lr_range, measure, model
from lbsgd.studies import plan_check
from lbsgd.studies import steps_to_target as stt
from lbsgd.studies.scales import Profile

CHECKED_UP_TO = model.CHECKED_UP_TO
PER_OCTAVE = 8  # held-out evaluations per doubling of the steps (the outside check's)
CAP = 3.0  # a run's epochs: this times its row's predicted (past the +50% edge, with margin)
PROBE_K = 4
BELOW, ABOVE = 0.25, 0.50
PAPER = "McCandlish et al. 2018: S = S_min (1 + B_noise/B) with eps(B) = eps_max/(1 + B_noise/B)"
# per profile: "networks", name -> keys over the ladder's; "probe_seed", the probe's seed (one of
# the ladder's); "seeds", the fresh seeds every planned batch up to 4 B_crit trains on.
# fashion-long: ResNet-8 and AlexNet-BN (0.025 per 16 from its probes), planned from the ladder's
# probe of seed 2, checked on fresh seeds
SETTINGS: dict[str, dict[str, Any]] = {
    "smoke": {"networks": {"resnet8": {}}, "probe_seed": 0, "seeds": (2, 3)},
    "fashion-long": {
        "networks": {"resnet8": {}, "alexnet_bn": {"model": "alexnet_bn", "base_lr": 0.025}},
        "probe_seed": 2,
        "seeds": (8, 9, 10),
    },
}


def claims(network: str) -> tuple[str, str]:
    return (
        f"{network} at the plan's lr: the predicted steps to the target lie within "
        f"{100 * BELOW:.0f}% of the measured ones below the plan's B_crit",
        f"{network} at the plan's lr: the predicted steps to the target lie within "
        f"{100 * ABOVE:.0f}% of the measured ones above the plan's B_crit",
    )


def probe_run(profile: Profile, network: str) -> dict[str, Any]:
    """The network's probe: the ladder's run at k = 4, its lr by the linear rule, the noise
    probe on, with the network's keys."""
    c = SETTINGS[profile.name]
    keys = stt.run_keys(profile, PROBE_K, 1.0, c["probe_seed"], stt.target_of(profile))
    return {**keys, **c["networks"][network]}


def plan_rows(probe_dir: Path, profile: Profile, compute, link, grad_bytes, tested=()) -> tuple:
    """(the plan's inputs, its one-GPU rows from the probe's batch to 4 B_crit) of a probe run
    (step times from the study's compute: this part reads steps and lr alone), the lr capped by
    the range test run of ``tested`` (a sweep's table of :func:`range_runs`; none: not yet run);
    (None, why) where the probe does not plan (``lbsgd plan``'s line)."""
    target = measure.Target("error", stt.target_of(profile))
    try:
        p = measure.read_probe(probe_dir, target, "pointed at")
    except ConfigError as e:
        return None, str(e)
    cfg, _ = measure.read_run(probe_dir)
    test = lr_range.read(Path(tested["run_dir"].iloc[0])) if len(tested) else None
    x = planner.inputs_for(cfg, p, compute, link, grad_bytes, test=test)
    top = CHECKED_UP_TO * x.b_crit
    rows = [r for r in model.table(x, model.powers_of_two(p.batch, top), (1,)) if r.batch <= top]
    return x, rows


def range_runs(profile: Profile, network: str, x, rows) -> list[dict[str, Any]]:
    """The lr range test (:mod:`lbsgd.plan.lr_range`) at the largest planned batch, from the
    probe's lr, with the probe's keys (none without a plan or a batch above the probe's)."""
    if x is None or rows[-1].batch <= x.probe_batch:
        return []
    keys = probe_run(profile, network)
    low, high = lr_range.span(x.probe_lr, x.probe_batch, rows[-1].batch)
    return [{**keys, **lr_range.keys(from_dict(keys), rows[-1].batch, low, high)}]


def to_target_runs(profile: Profile, network: str, x, rows) -> list[dict[str, Any]]:
    """Each row's batch on each seed at the row's lr and warmup, to the target (none without a
    plan)."""
    if x is None:
        return []
    c = SETTINGS[profile.name]
    rule, goal = x.lr.rule, stt.target_of(profile)
    out = []
    for r in rows:
        for seed in c["seeds"]:
            keys = {
                **stt.run_keys(profile, r.batch / profile.base["reference_batch"], 1.0, seed, goal),
                **c["networks"][network],
            }
            keys |= {
                "stop_at_error": goal,
                "eval_per_octave": PER_OCTAVE,
                "epochs": math.ceil(CAP * r.epochs * 100) / 100,
                "noise_scale": False,
                "noise_scale_batch": None,
            }
            keys |= planner.lr_keys(from_dict(keys), rule, r.lr, r.batch)
            out.append(keys)
    return out


def measured_steps(runs, target: float) -> dict[int, list[float]]:
    """batch → each seed's steps to the target (the first crossing of its evaluations,
    interpolated in log step; inf: never reached, having run past the band's upper edge)."""
    goal = measure.Target("error", target)
    out: dict[int, list[float]] = {}
    if len(runs) == 0:  # no plan, no runs
        return out
    for r in runs.sort_values("seed").itertuples():
        cfg, records = measure.read_run(Path(r.run_dir))
        s = measure.first_crossing(measure.curve(cfg, records, goal), target)
        out.setdefault(int(r.batch_size), []).append(math.inf if s is None else s)
    return out


def findings(network: str, x, rows, steps: dict[int, list[float]]) -> list[Finding]:
    """The network's two claims (the module's docstring); both invalid where its probe did not
    plan (``rows``: why)."""
    if x is None:
        v = studies.Verdict(None, f"the probe run does not plan: {rows}", invalid=True)
        return [studies.finding(c, v, "no plan", paper=PAPER) for c in claims(network)]
    return [_side(network, x, rows, steps, side) for side in ("below", "above")]


def describe(network: str, x, rows, steps: dict[int, list[float]]) -> str:
    """The network's plan and runs in a line."""
    if x is None:
        return f"{network}: not planned: {rows}"
    return f"{network}: B_crit {x.b_crit:.0f}, {x.lr.rule} lr ({x.lr.describe()}); " + "; ".join(
        f"batch {r.batch}: lr {r.lr:.3g}, {r.steps:.0f} predicted, measured "
        + ", ".join(f"{s:.0f}" for s in steps.get(r.batch, []))
        for r in rows
    )


def _side(network: str, x, rows, steps: dict[int, list[float]], side: str) -> Finding:
    claim = claims(network)[0 if side == "below" else 1]
    tol = BELOW if side == "below" else ABOVE
    tests, parts = [], []
    for r in rows:
        if (r.batch <= x.b_crit) != (side == "below") or r.batch not in steps:
            continue
        got = np.asarray(steps[r.batch], dtype=float)
        n = len(got)
        loo = stats.jackknife(n, lambda i, g=got, p=r.steps: p / stt.gmean(g[i]))
        t = stats.band(loo, r.steps / stt.gmean(got), 1 - tol, 1 + tol, n)
        tests.append(t)
        iv = t.interval
        marks = "".join(f"; {m}: not vouched for" for m in r.extrapolated)
        parts.append(
            f"batch {r.batch} (lr {r.lr:.3g}{marks}): {r.steps:.0f} predicted, "
            f"{stt.gmean(got):.0f} measured ({', '.join(f'{s:.0f}' for s in got)}), "
            f"x{iv.diff:.2f} [x{iv.low:.2f}, x{iv.high:.2f}]"
        )
    head = (
        f"plan from one probe: B_crit {x.b_crit:.0f}, {x.lr.rule} lr rule ({x.lr.describe()}); "
        f"predicted over measured, geometric means of {len(next(iter(steps.values()), []))} seeds"
    )
    none = "no planned batch on this side of B_crit"
    return plan_check.every_batch(claim, tests, tol, head, parts, none, paper=PAPER)


def networks(profile: Profile, chosen: Sequence[str] | None = None) -> Sequence[str]:
    """The networks checked: ``chosen`` (the notebook's parameter), else the profile's; one line
    naming one the profile does not define."""
    own = tuple(SETTINGS.get(profile.name, {}).get("networks", {}))
    if chosen is None:
        return own
    unknown = [n for n in chosen if n not in own]
    if unknown:
        raise ConfigError(
            f"networks={list(chosen)}: {unknown[0]!r} is not one of profile={profile.name}'s "
            f"({', '.join(own) or 'none'})"
        )
    return tuple(chosen)
