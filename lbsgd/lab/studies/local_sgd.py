"""12. Communication vs accuracy: synchronous SGD, post-local SGD (Lin et al. 2020) and BMUF (Chen
& Huo 2016) at equal numbers of all-reduces A, on K gloo processes.

Every run takes ``schedule=step`` (÷10 at half and three quarters of the epochs) and the local
phase starts at the first decay, ``switch_step`` = W, as Lin et al. define post-local SGD;
synchronous SGD does A = T all-reduces, post-local SGD and BMUF W + ⌈(T − W)/n⌉. The modelled
wall time is T · t_c(K) + A · t_ar(K) with notebook 10's α–β link (docs/studies.md, "Study 12").
Synchronous SGD does not depend on K and trains once on one process; post-local SGD and BMUF do,
so their run names carry ``-K<K>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from lbsgd import config
from lbsgd import costmodel as cost
from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import Verdict, mean
from lbsgd.lab.studies.scales import Profile

STUDY = "local_sgd"
TITLE = "12. Communication vs accuracy: post-local SGD and BMUF (Lin et al. 2020, Chen & Huo 2016)"
NPROCS = (2, 4)  # K: gloo processes of the local modes
PERIODS = (4, 16)  # n: local steps between two averagings
# "loses at most X points": Lin et al. (2020) report post-local SGD matching or beating mini-batch
# SGD at the same global batch (a qualitative claim here: no number of theirs is copied). At this
# scale the seed spread at k = 16 is ~1-2 points (notebook 3), so a loss of 1 point is what
# "matching" can mean here.
LOSS_PTS = 1.0
# "buys wall time": the modelled wall time falls by at least this share of synchronous SGD's
SAVE_PCT = 5.0
# The published relations beside ours (paper_* columns of the table): the most a mode loses
# against the one it is compared with, in points, and who reports it.
PAPER = {
    "local": (0.0, "Lin et al. 2020: post-local SGD matches or beats mini-batch SGD (vs sync)"),
    "bmuf": (0.0, "Chen & Huo 2016: BMUF matches or beats model averaging (vs local)"),
}


# -- the runs ----------------------------------------------------------------------------------


def batch_k(profile: Profile, k: float | None = None) -> float:
    """The study's global batch as k: ``k`` or the profile's ``large_k`` (cpu: 16, batch 256: the
    largest minibatch that still matches the small ones, notebook 3; at K = 4 each process's share
    is 64 samples, 4 BN groups of 16)."""
    return profile.large_k if k is None else k


def block_momentum_for(nproc: int) -> float:
    """Chen & Huo's block momentum for K processes: η_B = 1 − 1/K."""
    return 1.0 - 1.0 / nproc


def named(keys: Mapping[str, Any], nproc: int) -> dict[str, Any]:
    """``keys`` with ``name`` = the run's default name + ``-K<nproc>`` (K is not an experiment
    key, yet changes local SGD's mathematics)."""
    return {**keys, "name": f"{config.from_dict(dict(keys)).run_name()}-K{nproc}"}


def step_schedule(profile: Profile) -> dict[str, Any]:
    """The study's schedule: the profile's warmup, then the lr ÷10 at 1/2 and 3/4 of its epochs
    (Lin et al. 2020: ÷10 at epochs 150 and 225 of 300)."""
    epochs = float(profile.base["epochs"])
    return {"schedule": "step", "milestones": [epochs / 2, epochs * 3 / 4], "decay_factor": 0.1}


def first_decay_step(keys: Mapping[str, Any]) -> int:
    """The optimizer step of the first lr decay of a step schedule: where post-local SGD's local
    phase starts (Lin et al. 2020, §3)."""
    from lbsgd import data

    cfg = config.from_dict(dict(keys))
    if cfg.schedule != "step":
        raise config.ConfigError(
            f"schedule={cfg.schedule!r}: post-local SGD switches at the first decay of a step "
            "schedule (valid: schedule=step)"
        )
    d = config.derive(cfg, 1, data.train_size(cfg))
    return d.milestone_steps[0]  # milestones are increasing (config checks)


def sync_runs(profile: Profile, seeds: Sequence[int], k: float | None = None) -> list[dict]:
    """Synchronous SGD at the study's batch and step schedule, one per seed. Launched on one
    process."""
    return [profile.keys(k=batch_k(profile, k), seed=s, **step_schedule(profile)) for s in seeds]


def runs(
    profile: Profile,
    seeds: Sequence[int],
    nproc: int,
    periods: Sequence[int] = PERIODS,
    k: float | None = None,
    block_momentum: float | None = None,
    block_lr: float = 1.0,
    block_nesterov: bool = True,
) -> list[dict[str, Any]]:
    """Post-local SGD and BMUF on ``nproc`` processes, each period n of ``periods`` and seed, the
    local phase from the first lr decay (:func:`first_decay_step`); BMUF's block momentum None:
    :func:`block_momentum_for` ``nproc``."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 2:
        raise config.ConfigError(f"nproc={nproc!r} must be an integer >= 2 (K processes)")
    eta = block_momentum_for(nproc) if block_momentum is None else block_momentum
    out = []
    for n in periods:
        for s in seeds:
            keys = profile.keys(k=batch_k(profile, k), seed=s, **step_schedule(profile))
            local = {**keys, "local_sgd": n, "switch_step": first_decay_step(keys)}
            bmuf = {
                **local,
                "block_momentum": eta,
                "block_lr": block_lr,
                "block_nesterov": block_nesterov,
            }
            out += [named(local, nproc), named(bmuf, nproc)]
    return out


def sweep(S, runs: Sequence[Mapping[str, Any]], nproc: int):
    """:meth:`lbsgd.lab.studies.Session.sweep` on ``nproc`` processes per run; the runs with a column
    ``nproc``."""
    df = ex.sweep(
        S.study,
        runs,
        out_dir=S.out,
        profile=S.profile.name,
        **{**S.launch, "nproc_per_node": nproc},
    )
    return df.assign(nproc=nproc) if len(df) else df


# -- the cost of an all-reduce -----------------------------------------------------------------


def allreduce_fit(root: str | Path):
    """The all-reduce measurements of notebook 10 (``<root>/benchmarks/allreduce_cpu.json``, else
    the repository's committed ones): (the record, its path as a sweep's lines show one: relative
    to the working directory when under it, so an executed notebook names no machine's folder)."""
    paths = [
        Path(root) / "benchmarks" / "allreduce_cpu.json",
        studies.repo_root() / "results" / "benchmarks" / "allreduce_cpu.json",
    ]
    for p in paths:
        if p.is_file():
            return json.loads(p.read_text()), Path(ex.shown(p))
    raise FileNotFoundError(
        f"no all-reduce measurements in {', '.join(map(str, paths))}: run "
        "notebook 10 (or make bench) first"
    )


def link_text(ar: Mapping[str, Any], link: cost.Link) -> str:
    """Where the fit comes from, in words."""
    env = ar.get("environment", {})
    return (
        f"{ar.get('backend', '?')} all-reduce measured by notebook 10 on {ar.get('world_size')} "
        f"processes ({ar.get('nodes')} × {ar.get('processes_per_node')}, "
        f"{env.get('threads_per_process', '?')} thread each, machine {env.get('machine', '?')}): "
        f"α = {link.alpha_s * 1e6:.0f} µs, "
        f"β = {link.bandwidth_Bps / 1e9:.2f} GB/s"
    )


def param_bytes(keys: Mapping[str, Any]) -> int:
    """Bytes of the model's parameters (fp32: what an all-reduce of the gradient or of the
    parameters moves) for the run keys ``keys``."""
    from lbsgd import data, models

    cfg = config.from_dict(dict(keys))
    shape = data.shape_of(cfg)  # (classes, image size), before any data is read
    if shape is None:
        raise config.ConfigError(
            f"dataset={cfg.dataset!r}: a plugin's classes and image size are unknown before it "
            "is built (valid: a built-in dataset)"
        )
    net = models.build(cfg, *shape)
    return sum(p.numel() * p.element_size() for p in net.parameters())


# -- the measurements --------------------------------------------------------------------------


def all_reduces(total_steps: int, switch_step: int, period: int) -> int:
    """All-reduces of a run of T steps: T when synchronous (period 0); else the W synchronous
    steps before local SGD takes over (W: ``switch_step``, by default the warmup's steps) and the
    local phase's ⌈(T − W)/n⌉ averagings (steps W, W + n, …)."""
    if period == 0:
        return int(total_steps)
    w = min(int(switch_step), int(total_steps))
    return w + math.ceil((int(total_steps) - w) / int(period))


def _num(row: Mapping[str, Any], key: str, default: float) -> float:
    v = row.get(key, default)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def mode_of(row: Mapping[str, Any]) -> str:
    """sync (local_sgd 0), bmuf (block momentum or block lr off 0, 1), else local."""
    if int(_num(row, "local_sgd", 0)) == 0:
        return "sync"
    off = _num(row, "block_momentum", 0.0) != 0.0 or _num(row, "block_lr", 1.0) != 1.0
    return "bmuf" if off else "local"


def measure(df, nprocs: Sequence[int], link: cost.Link, model_bytes: int):
    """One row per run and K: ``mode``, ``nproc`` (K), ``period`` (n, 0 for sync), ``all_reduces``,
    ``compute_s`` (t_c(K) per step), ``allreduce_s`` (t_ar(K)), ``wall_s`` (modelled); the
    synchronous runs (trained once) repeated for every K of ``nprocs``. The top-1 error of a
    diverged run counts as 100%."""
    import pandas as pd

    df = studies.diverged_as_failed(df)
    df = df.assign(mode=[mode_of(r) for _, r in df.iterrows()])
    sync = df[df["mode"] == "sync"]
    rate = mean([float(v) for v in sync["img_per_s"]]) if len(sync) else math.nan
    rows = []
    for _, r in df.iterrows():
        ks = list(nprocs) if r["mode"] == "sync" else [int(r["nproc"])]
        for k in ks:
            period = int(_num(r, "local_sgd", 0))
            switch = _num(r, "switch_step", r["warmup_steps"])  # null: the warmup's end
            a = all_reduces(int(r["total_steps"]), int(switch), period)
            t_c = int(r["batch_size"]) / k / rate if rate > 0 else math.nan
            t_ar = cost.ring_time(model_bytes, k, link)
            rows.append(
                {
                    **r.to_dict(),
                    "nproc": k,
                    "period": period,
                    "all_reduces": a,
                    "compute_s": t_c,
                    "allreduce_s": t_ar,
                    "wall_s": int(r["total_steps"]) * t_c + a * t_ar,
                }
            )
    return pd.DataFrame(rows)


def table(m):
    """Per mode, K and n: runs, the error (mean, std), all-reduces, the modelled wall time, and
    the published relation (``paper_max_gap_pts``: the most the mode loses against the mode it is
    compared with; ``paper_source``)."""
    t = ex.summarize(m, ["mode", "nproc", "period"])
    g = m.groupby(["mode", "nproc", "period"], sort=True)
    t["all_reduces"] = g["all_reduces"].mean().to_numpy()
    t["wall_s_mean"] = g["wall_s"].mean().to_numpy()
    t["diverged"] = g["diverged"].sum().to_numpy()
    t["paper_max_gap_pts"] = [PAPER.get(x, (math.nan, ""))[0] for x in t["mode"]]
    t["paper_source"] = [PAPER.get(x, (math.nan, ""))[1] for x in t["mode"]]
    order = {"sync": 0, "local": 1, "bmuf": 2}
    t = t.sort_values(
        ["nproc", "period", "mode"], key=lambda c: c.map(order) if c.name == "mode" else c
    )
    return t.reset_index(drop=True)


# -- the findings ------------------------------------------------------------------------------


def _errs(m, mode: str, nproc: int, period: int | None = None) -> list[float]:
    sel = m[(m["mode"] == mode) & (m["nproc"] == nproc)]
    if period is not None:
        sel = sel[sel["period"] == period]
    return [float(v) for v in sel.sort_values("seed")["final_top1_error_pct"]]


def _pairs(m) -> list[tuple[int, int]]:
    """(K, n) of the local runs, sorted."""
    loc = m[m["mode"] != "sync"]
    return sorted({(int(k), int(n)) for k, n in zip(loc["nproc"], loc["period"], strict=True)})


def _f(values: Sequence[float]) -> str:
    return f"{mean(values):.2f}%" if values else "n/a"


def findings(m) -> list[Finding]:
    """From :func:`measure`'s rows:

    1. BMUF reaches post-local SGD's error at the same all-reduces (every K, n; paired over
       seeds, non-inferiority: BMUF no more than :data:`LOSS_PTS` points above);
    2. post-local SGD loses at most :data:`LOSS_PTS` points against synchronous SGD (every K, n);
    3. fewer all-reduces buy modelled wall time: at the largest K every local mode's modelled wall
       time is at least :data:`SAVE_PCT` % below synchronous SGD's (a model: no seeds to decide by;
       undecided without a throughput or fit).
    """
    chance = studies.chance_of(m)
    bmuf = _no_worse(
        m,
        "bmuf",
        "local",
        chance,
        "BMUF (Chen & Huo: η_B = 1 − 1/K, ε_B = 1, Nesterov) reaches post-local SGD's error at the "
        f"same number of all-reduces (no more than {LOSS_PTS:g} point above)",
        "block momentum on top of a momentum-SGD local learner "
        "amplifies the block step (≈ 1/(1 − η_B)) in a budget of a few epochs; Chen & "
        "Huo's gains are on long speech-model runs with many more blocks",
    )
    local = _no_worse(
        m,
        "local",
        "sync",
        chance,
        f"post-local SGD loses at most {LOSS_PTS:g} point against synchronous SGD at the same "
        "global batch (Lin et al. 2020 report it matching or beating mini-batch SGD)",
        "each process's local steps use B/K samples at the large-batch "
        "learning rate, and in a budget of a few epochs the local phase has few periods to "
        "recover from the drift between processes",
    )
    return [bmuf, local, _fewer_all_reduces(m)]


def _no_worse(m, a_mode: str, b_mode: str, chance, claim: str, why: str) -> Finding:
    """``a_mode``'s error no more than :data:`LOSS_PTS` points above ``b_mode``'s at every (K, n),
    paired over seeds, with the evidence per (K, n) and ``why`` where some mean lies against the
    claim (not at chance); the paper: :data:`PAPER`'s relation of ``a_mode``."""
    verdicts, parts, against = [], [], False
    for k, n in _pairs(m):
        a = _errs(m, a_mode, k, n)
        b = _errs(m, b_mode, k, None if b_mode == "sync" else n)
        if not a or not b:
            verdicts.append(Verdict(None, f"K={k} n={n}: no {a_mode if not a else b_mode} run"))
            continue
        against |= mean(a) - mean(b) > LOSS_PTS and not studies.at_chance([*a, *b], chance)
        v = studies.no_worse(a, b, LOSS_PTS, chance=chance, paired=len(a) == len(b))
        verdicts.append(replace(v, why=f"K={k} n={n}: {v.why}" if v.why else ""))
        ar = int(
            m[(m["mode"] == a_mode) & (m["nproc"] == k) & (m["period"] == n)]["all_reduces"].iloc[0]
        )
        parts.append(
            f"K={k} n={n} ({ar} all-reduces): {a_mode} {_f(a)} vs {b_mode} {_f(b)} "
            f"(Δ {mean(a) - mean(b):+.2f} points over {len(a)} seeds)"
        )
    v = studies.every(*verdicts) if verdicts else Verdict(None, "no local-SGD runs")
    who, what = PAPER[a_mode][1].split(": ", 1)
    paper = f"{who}: qualitative, {what}; no number in the reference data"
    return studies.finding(claim, v, "; ".join(parts) + studies.note(v, against, why), paper=paper)


def _fewer_all_reduces(m) -> Finding:
    """Claim 3: at the largest K every local mode's modelled wall time is at least
    :data:`SAVE_PCT` % below synchronous SGD's."""
    ks = sorted({k for k, _ in _pairs(m)})
    parts, saves = _savings(m, max(ks) if ks else None)
    if not saves or any(not math.isfinite(s) for s in saves):
        v3 = Verdict(
            None,
            "no modelled wall time (no throughput of the synchronous runs or no all-reduce fit)",
        )
    else:
        v3 = Verdict(all(s >= SAVE_PCT for s in saves))
    note3 = studies.note(
        v3,
        True,
        "compute dominates the step of this small model; the all-reduce "
        "of its parameters costs little next to it",
    )
    return studies.finding(
        f"fewer all-reduces buy modelled wall time: at K={max(ks) if ks else '?'} post-local SGD and "
        f"BMUF take at least {SAVE_PCT:g}% less modelled time than synchronous SGD",
        v3,
        "; ".join(parts)
        + f"; the claim: at least {SAVE_PCT:g}% saved at K={max(ks) if ks else '?'}"
        + _cost_text(m, ks)
        + note3,
        paper="no published number: lbsgd's cost model (α–β all-reduce fit of notebook 10) with "
        "this study's measured throughput",
    )


def _savings(m, top: int | None) -> tuple[list[str], list[float]]:
    """Per (K, n): post-local SGD's all-reduces and modelled wall time beside synchronous SGD's,
    in words; and the saving (%) of each local mode at K = ``top``."""
    parts, saves = [], []
    for k, n in _pairs(m):
        sync = m[(m["mode"] == "sync") & (m["nproc"] == k)]
        for mode in ("local", "bmuf"):
            sel = m[(m["mode"] == mode) & (m["nproc"] == k) & (m["period"] == n)]
            if not (len(sel) and len(sync["wall_s"])):
                continue
            w, ws = float(sel["wall_s"].mean()), float(sync["wall_s"].mean())
            save = 100 * (1 - w / ws) if ws > 0 else math.nan
            if mode == "local":
                parts.append(
                    f"K={k} n={n}: {int(sel['all_reduces'].iloc[0])} vs "
                    f"{int(sync['all_reduces'].iloc[0])} "
                    f"all-reduces, {w:.2f} s vs {ws:.2f} s modelled "
                    f"({save:.1f}% saved)"
                )
            if k == top:
                saves.append(save)
    return parts, saves


def _cost_text(m, ks: Sequence[int]) -> str:
    """The step's compute time and one all-reduce's, per K."""
    first = m.iloc[0] if len(m) else None
    cost_txt = (
        f"; per step: compute {first['compute_s'] * 1e3:.1f} ms at K={int(first['nproc'])}"
        if first is not None and math.isfinite(first["compute_s"])
        else ""
    )
    tar = ", ".join(
        f"{float(m[m['nproc'] == k]['allreduce_s'].iloc[0]) * 1e3:.2f} ms at K={int(k)}" for k in ks
    )
    return f"{cost_txt}; one all-reduce {tar}"
