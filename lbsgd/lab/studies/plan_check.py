"""Study 16: ``lbsgd plan`` against measured runs: does the plan predict what the runs then measure?

Part one plans from a probe run and sets each prediction beside its *reference* (:func:`reference`):
study 15's ladder where the profile has one, else study 11's sweep: B_crit within x3 of the fitted
one, the steps within 25% below B_crit and 50% above, the step time within 25% on 1 and 2
processes, the recommended batch's time within 15% of the best of five fixed batches. Part two
(pre-registered, :data:`SETTINGS`) trains every planned row up to 4 B_crit at the plan's own lr on
networks it was not tuned to. Over 600 lines: two references (ladder, sweep) each read seed by seed
or resampled, and part two; rules and results: docs/planning.md ("Accuracy on our profiles").
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lbsgd import costmodel, rundir
from lbsgd import plan as planner
from lbsgd.config import ConfigError, from_dict
from lbsgd.lab import experiments as ex
from lbsgd.lab import findings as fs
from lbsgd.lab import stats, studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import critical_batch as cb
from lbsgd.lab.studies import scaling
from lbsgd.lab.studies import steps_to_target as stt
from lbsgd.lab.studies.scales import Profile
from lbsgd.plan import lr_range, measure, model, timer

STUDY = "plan"
TITLE = "16. lbsgd plan against measured runs (McCandlish et al. 2018)"
PROBE_K = 4  # the probe's batch as k: the smallest ladder batch with two micro-batches a step
FIXED_KS = (4, 8, 16, 32, 64)  # the five fixed batches of claims 3 and 4 (the ladder's)
SWEEP_KS = (1, 2, 4, 8, 16)  # the same from study 11's sweep: the k every seed ran (to large_k)
NPROC = (1, 2)  # process counts planned and timed
TIMING_EPOCHS = 0.5  # a timing run's length
B_CRIT_FACTOR = 3.0  # claim 1: "within x3" (the literature's factor of 2-3 on B_crit)
STEPS_BELOW, STEPS_ABOVE = 0.25, 0.50  # claim 2's tolerances below and above B_crit
STEP_TIME_TOL = 0.25  # claim 3
WALL_TOL = 0.15  # claim 4
PAPER = (
    "McCandlish et al. 2018: B_noise an approximate predictor of B_crit; Pollux (Qiao et al. "
    "2021) and AdaScale use the same efficiency; none publishes prediction errors"
)


# -- the runs ----------------------------------------------------------------------------------


LADDER, SWEEP = "study 15's ladder", "study 11's sweep"


@dataclass(frozen=True)
class Reference:
    """The measured steps to a target a plan is checked against (:func:`reference`): ``source``
    (:data:`LADDER` or :data:`SWEEP`), the ``target``, each (batch, seed)'s measured ``steps``
    (NaN: never reached), the ``fit`` of S(B) = S_min (1 + B_crit/B) to them, the probe's k, the
    fixed batches' ks, the seeds, and the steps each run trained (``ran``: a run that never
    reached the target says only that it takes more)."""

    source: str
    target: measure.Target
    steps: dict[tuple[int, int], float]
    fit: Any
    probe_k: float
    fixed_ks: tuple[float, ...]
    seeds: tuple[int, ...]
    ran: dict[tuple[int, int], int] = field(default_factory=dict)
    per_seed: stats.SeedSteps | None = None  # the ladder's measuring seeds, for the jackknife

    @property
    def b_crit(self) -> float:
        return self.fit.b_crit if self.fit is not None else math.nan


def reference(profile_dir: Path, profile: Profile) -> Reference:
    """The profile's reference, read from the files its study wrote: study 15's ladder
    (``seed_steps.csv``: each k's measuring seeds at its chosen lr) where the profile has one, else
    study 11's sweep (``steps.csv``, and ``fit.csv``: its target loss, baseline k and fit); one
    line when that study has not written them."""
    import pandas as pd

    lad = bool(stt.settings(profile))
    study, notebook = (stt.STUDY, "15_steps_to_target") if lad else (cb.STUDY, "11_critical_batch")
    folder = Path(profile_dir) / study
    files = ["seed_steps.csv"] if lad else ["steps.csv", "fit.csv"]
    if missing := [f for f in files if not (folder / f).is_file()]:
        which = "study 15's ladder" if lad else "study 11's sweep on a profile without a ladder"
        raise ConfigError(
            f"study 16 reads {which}, and {folder} holds no {missing[0]}: execute "
            f"notebooks/{notebook}.ipynb first (make reproduce runs it before)"
        )
    m, per_seed = pd.read_csv(folder / files[0], float_precision="round_trip"), None
    if lad:
        per_seed = stats.SeedSteps.of(m)
        target = measure.Target("error", float(m["target_error"].iloc[0]))
        fit, probe_k, fixed, used = per_seed.fit(), PROBE_K, FIXED_KS, per_seed.seeds
    else:
        target, probe_k, fit = _sweep_fit(folder / "fit.csv", m)
        fixed, used = SWEEP_KS, tuple(profile.seeds)
    steps = {(int(r.batch_size), int(r.seed)): float(r.steps_to_target) for r in m.itertuples()}
    ran = {(int(r.batch_size), int(r.seed)): int(r.total_steps) for r in m.itertuples()}
    source = LADDER if lad else SWEEP
    return Reference(source, target, steps, fit, probe_k, fixed, used, ran, per_seed)


def _sweep_fit(path: Path, m) -> tuple[measure.Target, float, stats.Fit | None]:
    """Study 11's target loss, baseline k (the smallest k of its runs ``m`` if none) and fit, from
    its ``fit.csv``."""
    import pandas as pd

    f = pd.read_csv(path, float_precision="round_trip").iloc[0]
    probe_k = float(f["baseline_k"] if pd.notna(f["baseline_k"]) else m["k"].min())
    values = (f["s_min"], f["e_min"], f["b_crit"], f["fit_rms_rel"])
    fit = stats.Fit(*map(float, values), int(f["fit_points"])) if f["fit_points"] else None
    return measure.Target("loss", float(f["target_loss"])), probe_k, fit


def _runs(profile: Profile, ref: Reference, ks: Sequence[float], seeds: Sequence[int]):
    """Each k's run to the target at the linear rule's lr on ``seeds`` (the reference's keys)."""
    if ref.source == LADDER:
        return [stt.run_keys(profile, k, 1.0, s, ref.target.value) for k in ks for s in seeds]
    return cb.runs(profile, seeds, ks)


def probe_runs(profile: Profile, ref: Reference, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The reference's run at its probe k at the linear rule's lr, one per seed (the plan's
    probe)."""
    return _runs(profile, ref, [ref.probe_k], seeds)


def to_target_runs(
    profile: Profile, ref: Reference, ks: Sequence[float], seed: int
) -> list[dict[str, Any]]:
    """Each k's run to the target at the linear rule's lr (the plan's), one seed."""
    return _runs(profile, ref, ks, [seed])


def wall_steps(profile: Profile, ref: Reference, runs) -> dict[int, float]:
    """batch → steps to the target of ``runs`` (:func:`to_target_runs`' DataFrame), measured as
    the reference measures them (NaN: never reached)."""
    if ref.source == LADDER:
        m = stt.measure(runs, ref.target.value, stt.base_lr(profile))
    else:
        m = cb.measure(runs, profile.large_k, target=ref.target.value)
    return {int(r.batch_size): float(r.steps_to_target) for r in m.itertuples()}


def timing_runs(
    profile: Profile,
    ref: Reference,
    ks: Sequence[float],
    nproc: int,
    max_micro: int,
    epochs: float = TIMING_EPOCHS,
) -> list[dict[str, Any]]:
    """Short runs at each k for their steady step time on ``nproc`` processes, each in the
    micro-batches the plan times it in (the largest multiple of bn_batch up to ``max_micro`` that
    divides a process's share; none where a process would hold less than one BN group): the
    reference's keys, no probe, no evaluation, named by their layout (no experiment key)."""
    own = {"epochs": epochs, "eval_every": 0, "checkpoint": False}
    if ref.source == LADDER:
        lad = stt.settings(profile)
        ladder_keys = {"base_lr": stt.base_lr(profile), "holdout": lad["holdout"]}
        own = {**lad.get("keys", {}), **ladder_keys, **own}
    runs = []
    for k in ks:
        keys = profile.keys(k=k, **own)
        b = keys["batch_size"]
        micro = model.micro_batch(b // nproc, max_micro, keys["bn_batch"])
        if micro is None:  # fewer samples a process than one BN group: no such layout
            continue
        runs.append({**keys, "micro_batch": micro, "name": f"timing-b{b}-m{micro}-np{nproc}"})
    return runs


def sweep_on(session, runs: Sequence[dict[str, Any]], nproc: int):
    """The runs on ``nproc`` processes each, one at a time (their timings share no core)."""
    launch = {**session.launch, "nproc_per_node": nproc, "parallel": 1}
    return ex.sweep(
        session.study, runs, out_dir=session.out, profile=session.profile.name, **launch
    )


def link(study_dir: Path, small: bool = False) -> tuple[costmodel.Link, dict[str, Any]]:
    """α and β of a 2-process ring all-reduce on this machine (``lbsgd bench allreduce``), measured
    into the study's folder unless there already; ``small``: tiny sizes (smoke), where the timings
    may not separate α and β (study 10's fallback then: α = 0, β from the largest message)."""
    from lbsgd.bench import comm as bench_comm

    out = Path(study_dir) / "allreduce_2proc.json"
    if not out.exists():
        bench_comm.bench_allreduce(
            nproc=2,
            nodes=1,
            min_bytes=1024,
            max_bytes=2**20 if small else 2**24,
            iters=3 if small else 10,
            out=ex.shown(out),
        )
    doc = json.loads(out.read_text())
    return scaling.link(doc), doc


SMALL_TIMING = 512  # samples of each timing run at smoke scale, one run a size (else lbsgd plan's)


def measured_compute(
    study_dir: Path, probe_cfg, link_: costmodel.Link, small: bool = False, processes=NPROC
) -> tuple[model.Compute, dict[str, Any]]:
    """A worker's compute and, where ``processes`` plans more than one, a 2-process step's extra
    (``lbsgd plan``'s measurements, :func:`lbsgd.plan.timer.time_compute` and
    :func:`~lbsgd.plan.timer.time_sync`), measured into the study's ``compute.json`` (the timing
    runs' own output dropped) unless there already: the findings are then a function of the
    study's files, as study 10's of its benchmarks. ``small``: short timing runs (smoke)."""
    out = Path(study_dir) / "compute.json"
    if not out.exists():
        samples, runs = (SMALL_TIMING, 1) if small else (None, None)
        log = Path(os.devnull)  # the timing runs' own output: dropped, not in the notebook
        compute, info = timer.time_compute(probe_cfg, samples=samples, runs=runs, log=log)
        sync_info = {"sync_s": 0.0, "sync_from": "not measured: one process planned"}
        if max(processes) > 1:
            compute, sync_info = timer.time_sync(
                probe_cfg, compute, link_, info["grad_bytes"], samples, runs, log
            )
        doc = {"compute": asdict(compute), "info": {**info, **sync_info}}
        with rundir.replacing(out) as tmp:
            tmp.write_text(json.dumps(doc, indent=2) + "\n")
    doc = json.loads(out.read_text())
    return model.Compute(**doc["compute"]), doc["info"]


# -- the plans -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    seed: int
    probe: measure.Probe
    inputs: model.Inputs
    rows: list[model.Row]
    best: model.Row | None

    def row(self, batch: int, gpus: int) -> model.Row | None:
        return next((r for r in self.rows if (r.batch, r.gpus) == (batch, gpus)), None)


def make_plans(
    probes, target: measure.Target, compute, link_, grad_bytes: float, gpus=NPROC
) -> tuple[list[Plan], list[str]]:
    """One plan per probe run (``probes``: the probe runs' DataFrame), planned over the powers of
    two from one BN group (the ladder's smallest batches lie below the probe's) to an 8-step epoch
    (``lbsgd plan --batches``); and, for each probe that cannot be planned from (it does not
    approach the target), ``lbsgd plan``'s line."""
    plans, missing = [], []
    for r in probes.sort_values("seed").itertuples():
        try:
            p = measure.read_probe(Path(r.run_dir), target, "pointed at")
        except ConfigError as e:
            missing.append(f"seed {r.seed}: {e}")
            continue
        cfg, _ = measure.read_run(Path(r.run_dir))
        x = planner.inputs_for(cfg, p, compute, link_, grad_bytes)
        top = planner.batch_range(cfg, None)[-1]
        rows = model.table(x, model.powers_of_two(cfg.bn_batch, top), gpus)
        plans.append(Plan(int(r.seed), p, x, rows, model.recommend(rows)))
    return plans, missing


def plan_table(plans: Sequence[Plan]):
    """Every plan's rows, with its seed."""
    import pandas as pd

    return pd.DataFrame([{"seed": p.seed, **r.as_dict()} for p in plans for r in p.rows])


# -- measurements beside predictions -------------------------------------------------------------


def ladder_steps(ref: Reference) -> dict[int, float]:
    """batch → the steps the training-time check reads on the ladder: the geometric mean of its
    measuring seeds' runs at the batch's chosen lr (NaN: one never reached the target)."""
    s = ref.per_seed
    return {int(b): stats.gmean(s.steps[j]) for j, b in enumerate(s.batches)}


def step_times(timed) -> dict[tuple[int, int], float]:
    """(batch, processes) → the measured steady step time: batch / img_per_s (summary.json)."""
    return {
        (int(r.batch_size), int(r.world_size)): float(r.batch_size) / float(r.img_per_s)
        for r in timed.itertuples()
        if r.img_per_s
    }


def comparison_table(plans: Sequence[Plan], ref_steps, times, wall_steps, b_crit_fit):
    """Per seed's plan and batch: predicted and measured steps (the reference's),
    and per process count the predicted and measured step time and training time. Without a plan
    (no probe reached the target), the measurements alone, one row per timed batch and count."""
    import pandas as pd

    if not plans:
        rows = [_measured_row(b, n, times, wall_steps, b_crit_fit) for b, n in sorted(times)]
        return pd.DataFrame(rows, columns=COLUMNS)
    rows = []
    for p in plans:
        for r in p.rows:
            row = _measured_row(r.batch, r.gpus, times, wall_steps, b_crit_fit)
            best = p.best is not None and (r.batch, r.gpus) == (p.best.batch, p.best.gpus)
            row |= {
                "seed": p.seed,
                "b_crit_plan": p.inputs.b_crit,
                "steps_plan": r.steps,
                "steps_reference": ref_steps.get((r.batch, p.seed), math.nan),
                "step_ms_plan": 1e3 * r.step_s,
                "train_s_plan": r.wall_s,
                "recommended": best,
            }
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _measured_row(batch: int, nproc: int, times, wall_steps, b_crit_fit) -> dict[str, Any]:
    """A table row's measurements (the predictions NaN until a plan fills them)."""
    meas_t = times.get((batch, nproc), math.nan)
    steps_lin = wall_steps.get(batch, math.nan)  # the training-time check's steps
    return {
        "seed": math.nan,
        "batch_size": batch,
        "nproc": nproc,
        "b_crit_plan": math.nan,
        "b_crit_fit": b_crit_fit,
        "steps_plan": math.nan,
        "steps_reference": math.nan,
        "step_ms_plan": math.nan,
        "step_ms_measured": 1e3 * meas_t,
        "train_s_plan": math.nan,
        "steps_trained": steps_lin,
        "train_s_measured": steps_lin * meas_t,
        "recommended": False,
    }


COLUMNS = list(_measured_row(0, 1, {}, {}, math.nan))  # comparison_table's


# -- the findings -------------------------------------------------------------------------------


def _band(inside: Sequence[bool]) -> studies.Verdict:
    """Every point inside: replayed; none: not replayed; else undecided."""
    if not inside:
        return studies.Verdict(None, "nothing to compare")
    if all(inside):
        return studies.Verdict(True)
    if not any(inside):
        return studies.Verdict(False)
    return studies.Verdict(None, f"{sum(inside)} of {len(inside)} inside")


def findings(
    plans, ref: Reference, times, wall_steps, fixed: Sequence[int], missing=()
) -> list[Finding]:
    """The four claims (module docstring); every one invalid when a probe run could not be planned
    from (``missing``: why): a plan from some seeds only would pick the seeds."""
    if missing or not plans:
        why = "; ".join(missing) or "no probe run"
        v = studies.Verdict(None, f"the probe run does not plan: {why}", invalid=True)
        return [studies.finding(c, v, "no plan", paper=PAPER) for c in CLAIMS]
    return [
        _critical_batch(plans, ref),
        *steps_findings(plans, ref),
        *(_step_time(plans[0], times, fixed, p) for p in NPROC),
        _recommended(plans[0], times, wall_steps, fixed, _per_seed(plans, ref)),
    ]


CLAIMS = (
    f"the predicted critical batch lands within x{B_CRIT_FACTOR:g} of the one fitted to the "
    "measured steps to the target",
    f"the predicted steps to the target lie within {100 * STEPS_BELOW:.0f}% of the measured ones "
    "below B_crit",
    f"the predicted steps to the target lie within {100 * STEPS_ABOVE:.0f}% of the measured ones "
    "above B_crit",
    *(
        f"the predicted step time lies within {100 * STEP_TIME_TOL:.0f}% of the measured one on "
        f"{n} process{'es' if n > 1 else ''}"
        for n in NPROC
    ),
    f"the recommended batch trains to the target within {100 * WALL_TOL:.0f}% of the best of "
    f"{len(FIXED_KS)} fixed batch sizes",
)


def _critical_batch(plans: Sequence[Plan], ref: Reference) -> Finding:
    claim, fit = CLAIMS[0], ref.fit
    if fit is None or not 0 < fit.b_crit < math.inf:
        v = studies.Verdict(None, f"{ref.source}'s fit has no finite B_crit")
        return studies.finding(claim, v, f"no fit of {ref.source}", paper=PAPER)
    # measured, not tested: the plan's B_crit is the probe's B_noise, and study 15 (or 11) tests
    # B_crit against B_noise already; one statistic, one claim
    ratios = [p.inputs.b_crit / fit.b_crit for p in plans]
    inside = [1 / B_CRIT_FACTOR <= q <= B_CRIT_FACTOR for q in ratios]
    ev = (
        f"B_crit {fit.b_crit:.0f} fitted to {ref.source} (S_min {fit.s_min:.0f}, {fit.points} "
        f"batches, to {ref.target}); predicted "
        + ", ".join(
            f"{p.inputs.b_crit:.0f} (seed {p.seed}: x{q:.2f})"
            for p, q in zip(plans, ratios, strict=True)
        )
        + f" (the claim: each within x1/{B_CRIT_FACTOR:g} to x{B_CRIT_FACTOR:g}; measured: "
        f"{ref.source}'s own B_crit against B_noise is the tested claim)"
        + _miss(ratios, inside, lambda q: f"x{max(q, 1 / q):.2f} off")
    )
    return studies.finding(claim, _band(inside), ev, paper=PAPER)


# -- the ladder's seeds, resampled -----------------------------------------------------------------


def _per_seed(plans: Sequence[Plan], ref: Reference) -> stats.SeedSteps | None:
    """The ladder's measuring seeds where the claims read them seed by seed: two or
    more, each with a plan; None elsewhere (study 11's sweep: one seed a batch beyond large_k)."""
    s = ref.per_seed
    planned = {p.seed for p in plans}
    if s is None or len(s.seeds) < 2 or not set(s.seeds) <= planned:
        return None
    return s


def _ratio(s: stats.SeedSteps, num, den, band: tuple[float, float]) -> stats.Test:
    """``num(idx) / den(idx)`` (idx: seeds' indices) by its jackknife-t interval, tested inside
    ``band`` (:func:`lbsgd.lab.stats.band`)."""
    every = np.arange(len(s.seeds))
    point = num(every) / den(every)
    return stats.band(s.jackknife(lambda i: num(i) / den(i)), point, *band, len(s.seeds))


def _ratio_text(t: stats.Test) -> str:
    iv = t.interval
    return f"x{iv.diff:.2f}, 95% CI [x{iv.low:.2f}, x{iv.high:.2f}] ({iv.test}, n = {iv.n})"


def steps_findings(plans: Sequence[Plan], ref: Reference) -> list[Finding]:
    s = _per_seed(plans, ref)
    if s is not None:
        return [_steps_resampled(plans, ref, s, side) for side in ("below", "above")]
    return _steps_per_seed(plans, ref)


def _steps_per_seed(plans: Sequence[Plan], ref: Reference) -> list[Finding]:
    """Claim 2 seed by seed (study 11's sweep): each seed's plan against its run at each batch."""
    b_crit = ref.b_crit
    out = []
    for side, tol in (("below", STEPS_BELOW), ("above", STEPS_ABOVE)):
        pts, short = [], []
        for p in plans:
            for (batch, seed), meas in sorted(ref.steps.items()):
                r = p.row(batch, 1)
                below = batch <= b_crit
                if seed != p.seed or r is None or (side == "below") != below:
                    continue
                if batch == p.probe.batch:  # the plan's own input, no prediction
                    continue
                ran = ref.ran.get((batch, seed), 0)
                if not math.isfinite(meas) and ran < r.steps / (1 - tol):
                    # never reached, but stopped before the band's edge (measured steps past
                    # pred / (1 - tol) put pred / measured - 1 below -tol): no comparison
                    short.append(f"batch {batch} seed {seed} never reached it in its {ran} steps")
                    continue
                pts.append((batch, seed, r.steps, meas, ran))
        out.append(_steps_finding(side, tol, pts, b_crit, ref.source, short))
    return out


def _steps_finding(side: str, tol: float, pts, b_crit: float, source: str, short) -> Finding:
    claim = CLAIMS[1] if side == "below" else CLAIMS[2]
    errs = [pred / meas - 1 if math.isfinite(meas) else math.inf for _, _, pred, meas, _ in pts]
    inside = [abs(e) <= tol for e in errs]
    ev = (
        f"B_crit {b_crit:.0f} ({source}'s fit); "
        + (
            "; ".join(
                f"batch {b} seed {s}: {pred:.0f} predicted, "
                + (
                    f"{meas:.0f} measured ({_pct(e)})"
                    if math.isfinite(meas)
                    else f"never reached in its {ran} steps, past the band's {pred / (1 - tol):.0f}"
                )
                for (b, s, pred, meas, ran), e in zip(pts, errs, strict=True)
            )
            or f"no batch of {source} on this side"
        )
        + f" (the claim: each within ±{100 * tol:.0f}%)"
        + _miss(errs, inside, _pct)
        + (f"; not compared: {', '.join(short)}, short of the band's edge" if short else "")
    )
    return studies.finding(claim, _band(inside), ev, paper=PAPER)


def _steps_resampled(plans: Sequence[Plan], ref: Reference, s: stats.SeedSteps, side: str):
    """Claim 2 on one side of B_crit from the ladder's seeds: each batch's predicted steps (the
    geometric mean of its seeds' plans) over the measured (of their runs), its ratio's jackknife-t
    interval inside 1 ± tol for every batch (replayed), or one wholly outside (not replayed)."""
    claim, tol = (CLAIMS[1], STEPS_BELOW) if side == "below" else (CLAIMS[2], STEPS_ABOVE)
    probe, of = plans[0].probe.batch, {p.seed: p for p in plans}  # each seed's plan
    tests, parts = [], []
    for j, batch in enumerate(int(b) for b in s.batches):
        if (batch <= ref.b_crit) != (side == "below") or batch == probe:
            continue
        pred = np.array([getattr(of[i].row(batch, 1), "steps", math.nan) for i in s.seeds], float)
        t = _ratio(
            s,
            lambda i, pr=pred: stats.gmean(pr[i]),
            lambda i, j=j: stats.gmean(s.steps[j, i]),
            (1 - tol, 1 + tol),
        )
        tests.append(t)
        parts.append(
            f"batch {batch}: {stats.gmean(pred):.0f} predicted, {stats.gmean(s.steps[j]):.0f} "
            f"measured, {_ratio_text(t)}"
        )
    head = f"B_crit {ref.b_crit:.0f} ({ref.source}'s fit); geometric means of {len(s.seeds)} seeds"
    return every_batch(claim, tests, tol, head, parts, f"no batch of {ref.source} on this side")


def every_batch(claim: str, tests, tol: float, head: str, parts, none: str, paper=PAPER):
    """A claim on steps that holds when every batch's interval lies inside 1 ± ``tol``
    (replayed) and fails when one lies wholly outside (not replayed); ``none``: why there is
    no batch to test."""
    if not tests:
        return studies.finding(claim, studies.Verdict(None, none), head, paper=paper)
    p_for, p_against = stats.all_of(tests)
    v = fs.decide(
        p_for,
        p_against,
        f"p = {min(p_for, p_against):.3g} (every batch inside, or one wholly outside)",
        f"not every interval inside x{1 - tol:g}-x{1 + tol:g}, none wholly outside",
    )
    return studies.finding(claim, v, head + "; " + "; ".join(parts), paper=paper)


def _step_time(plan: Plan, times, fixed: Sequence[int], nproc: int) -> Finding:
    claim = CLAIMS[3 + NPROC.index(nproc)]
    pts = []
    for b in fixed:
        r, meas = plan.row(b, nproc), times.get((b, nproc))
        if r is not None and meas is not None:
            pts.append((b, r.step_s, meas, r.step_s / meas - 1))
    errs = [e for *_, e in pts]
    inside = [abs(e) <= STEP_TIME_TOL for e in errs]
    ev = (
        "; ".join(
            f"batch {b}: {1e3 * pred:.1f} ms predicted, {1e3 * meas:.1f} ms measured ({_pct(e)})"
            for b, pred, meas, e in pts
        )
        or "no timing run"
    )
    verdict = studies.Verdict(all(inside)) if pts else studies.Verdict(None, "no timing run")
    band = f" (the claim: each within ±{100 * STEP_TIME_TOL:.0f}%)"
    return studies.finding(claim, verdict, ev + band + _miss(errs, inside, _pct), paper=PAPER)


def _recommended(plan: Plan, times, wall_steps, fixed: Sequence[int], s=None) -> Finding:
    """Claim 4 from the ladder's seeds where ``s`` holds them (:func:`_recommended_resampled`),
    else from one run a batch at the linear rule's lr (study 11's sweep)."""
    best = plan.best
    if best is None:
        v = studies.Verdict(None, "the plan recommends nothing (no batch within 2 E_min)")
        return studies.finding(CLAIMS[-1], v, "no recommendation", paper=PAPER)
    if s is not None:
        return _recommended_resampled(plan, times, fixed, s)
    p = best.gpus
    wall = {
        b: wall_steps.get(b, math.nan) * times.get((b, p), math.nan)
        for b in sorted({*fixed, best.batch})
    }
    reached = {b: w for b, w in wall.items() if b in fixed and math.isfinite(w)}
    ours = wall.get(best.batch, math.nan)
    head = (
        f"recommended batch {best.batch} on {p} process{'es' if p > 1 else ''} (plan seed "
        f"{plan.seed}); measured training time to the target at the linear rule's lr "
        f"(steps of its run x the measured step time): "
        + "; ".join(f"batch {b}: {wall_text(b, w, times, p)}" for b, w in wall.items())
    )
    if not reached or not math.isfinite(ours):
        v = studies.Verdict(None, "the recommended batch or every fixed one never reached it")
        return studies.finding(CLAIMS[-1], v, head, paper=PAPER)
    top = min(reached, key=reached.get)
    ratio = ours / reached[top]
    ev = (
        f"{head}; best fixed: batch {top}, the recommended one x{ratio:.2f} of it (the claim: "
        f"at most x{1 + WALL_TOL:g})"
    )
    if ratio > 1 + WALL_TOL:
        ev += f"; missed by {100 * (ratio - 1 - WALL_TOL):.0f} points beyond the 15%"
    return studies.finding(CLAIMS[-1], studies.Verdict(ratio <= 1 + WALL_TOL), ev, paper=PAPER)


def _recommended_resampled(plan: Plan, times, fixed: Sequence[int], s: stats.SeedSteps) -> Finding:
    """Claim 4 from the ladder's seeds: each batch's training time to the target is the geometric
    mean of its seeds' steps at its study-15 lr times the measured step time; the recommended
    batch's over the best fixed one's (the best chosen again on each set of seeds), its jackknife-t
    interval below 1 + tol (replayed) or wholly above (not replayed)."""
    p, best = plan.best.gpus, plan.best.batch
    row = {int(b): j for j, b in enumerate(s.batches)}
    step_s = {b: times.get((b, p), math.nan) for b in {*fixed, best}}
    head = (
        f"recommended batch {best} on {p} process{'es' if p > 1 else ''} (plan seed {plan.seed}); "
        f"training time to the target (the geometric mean of {len(s.seeds)} seeds' steps at the "
        "batch's study-15 lr x the measured step time): "
    )
    if best not in row or any(b not in row for b in fixed):
        v = studies.Verdict(None, "the ladder has no runs at the recommended or a fixed batch")
        return studies.finding(CLAIMS[-1], v, head + "not measured", paper=PAPER)

    def wall(b: int, i) -> float:
        return stats.gmean(s.steps[row[b], i]) * step_s[b]

    every = np.arange(len(s.seeds))
    t = _ratio(
        s, lambda i: wall(best, i), lambda i: min(wall(b, i) for b in fixed), (0.0, 1 + WALL_TOL)
    )
    top = min(fixed, key=lambda b: wall(b, every))
    ev = (
        head
        + "; ".join(f"batch {b}: {wall_text(b, wall(b, every), times, p)}" for b in sorted(step_s))
        + f"; best fixed: batch {top}, the recommended one {_ratio_text(t)} of the best"
    )
    across = f"the interval reaches across x{1 + WALL_TOL:g}"
    v = fs.decide(t.p_for, t.p_against, f"p = {t.p:.3g}", across)
    return studies.finding(CLAIMS[-1], v, ev, paper=PAPER)


def _pct(e: float) -> str:
    return f"{100 * e:+.0f}%" if math.isfinite(e) else "never reached"


def wall_text(batch: int, wall: float, times, nproc: int) -> str:
    """A fixed batch's measured training time, or why it has none."""
    if math.isfinite(wall):
        return f"{wall:.1f} s"
    if (batch, nproc) not in times:
        return f"no layout on {nproc} processes" if nproc > 1 else "not timed"
    return "never reached"


def _miss(values, inside, fmt) -> str:
    """ "; missed: …" listing the values outside the band."""
    out = [fmt(v) for v, ok in zip(values, inside, strict=True) if not ok]
    return f"; outside: {', '.join(out)}" if out else ""


# -- part two, pre-registered: every planned row at the plan's own lr ----------------------------
# Per network of SETTINGS: one probe, ``lbsgd plan``'s rows from it (its lr range test capping the
# lrs), every planned batch up to CHECKED_UP_TO x B_crit trained at the row's lr and warmup on
# fresh seeds, stopped at the target (capped at CAP x the row's epochs); predicted steps within
# 25% of the measured below B_crit, within 50% above, by each batch's jackknife-t interval. Its
# claims, bands, seeds and cap are not to change; record and results: docs/planning.md ("At the
# plan's own lr").

CHECKED_UP_TO = model.CHECKED_UP_TO
PER_OCTAVE = 8  # held-out evaluations per doubling of the steps (the outside check's)
CAP = 3.0  # a run's epochs: this times its row's predicted (past the +50% edge, with margin)
PAPER_LR = "McCandlish et al. 2018: S = S_min (1 + B_noise/B) with eps(B) = eps_max/(1 + B_noise/B)"
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


def at_plan_lr_claims(network: str) -> tuple[str, str]:
    return (
        f"{network} at the plan's lr: the predicted steps to the target lie within "
        f"{100 * STEPS_BELOW:.0f}% of the measured ones below the plan's B_crit",
        f"{network} at the plan's lr: the predicted steps to the target lie within "
        f"{100 * STEPS_ABOVE:.0f}% of the measured ones above the plan's B_crit",
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
    if x is None or rows[-1].batch <= x.lr.anchor_batch:
        return []
    keys = probe_run(profile, network)
    low, high = lr_range.span(x.lr.anchor_lr, x.lr.anchor_batch, rows[-1].batch)
    return [{**keys, **lr_range.keys(from_dict(keys), rows[-1].batch, low, high)}]


def at_plan_lr_runs(profile: Profile, network: str, x, rows) -> list[dict[str, Any]]:
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
                "stop_at_error": goal,
                "eval_per_octave": PER_OCTAVE,
                "epochs": math.ceil(CAP * r.epochs * 100) / 100,
                "noise_scale": False,
                "noise_scale_batch": None,
            }
            keys |= model.lr_keys(from_dict(keys), rule, r.lr, r.batch)
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


def at_plan_lr_findings(network: str, x, rows, steps: dict[int, list[float]]) -> list[Finding]:
    """The network's two claims (the module's docstring); both invalid where its probe did not
    plan (``rows``: why)."""
    if x is None:
        v = studies.Verdict(None, f"the probe run does not plan: {rows}", invalid=True)
        return [
            studies.finding(c, v, "no plan", paper=PAPER_LR) for c in at_plan_lr_claims(network)
        ]
    return [_at_plan_lr_side(network, x, rows, steps, side) for side in ("below", "above")]


def describe(network: str, x, rows, steps: dict[int, list[float]]) -> str:
    """The network's plan and runs in a line."""
    if x is None:
        return f"{network}: not planned: {rows}"
    return f"{network}: B_crit {x.b_crit:.0f}, {x.lr.rule} lr ({x.lr.describe()}); " + "; ".join(
        f"batch {r.batch}: lr {r.lr:.3g}, {r.steps:.0f} predicted, measured "
        + ", ".join(f"{s:.0f}" for s in steps.get(r.batch, []))
        for r in rows
    )


def _at_plan_lr_side(network: str, x, rows, steps: dict[int, list[float]], side: str) -> Finding:
    claim = at_plan_lr_claims(network)[0 if side == "below" else 1]
    tol = STEPS_BELOW if side == "below" else STEPS_ABOVE
    tests, parts = [], []
    for r in rows:
        if (r.batch <= x.b_crit) != (side == "below") or r.batch not in steps:
            continue
        got = np.asarray(steps[r.batch], dtype=float)
        n = len(got)
        loo = stats.jackknife(n, lambda i, g=got, p=r.steps: p / stats.gmean(g[i]))
        t = stats.band(loo, r.steps / stats.gmean(got), 1 - tol, 1 + tol, n)
        tests.append(t)
        iv = t.interval
        marks = "".join(f"; {m}: not vouched for" for m in r.extrapolated)
        parts.append(
            f"batch {r.batch} (lr {r.lr:.3g}{marks}): {r.steps:.0f} predicted, "
            f"{stats.gmean(got):.0f} measured ({', '.join(f'{s:.0f}' for s in got)}), "
            f"x{iv.diff:.2f} [x{iv.low:.2f}, x{iv.high:.2f}]"
        )
    head = (
        f"plan from one probe: B_crit {x.b_crit:.0f}, {x.lr.rule} lr rule ({x.lr.describe()}); "
        f"predicted over measured, geometric means of {len(next(iter(steps.values()), []))} seeds"
    )
    none = "no planned batch on this side of B_crit"
    return every_batch(claim, tests, tol, head, parts, none, paper=PAPER_LR)


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
