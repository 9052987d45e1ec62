"""3. Minibatch size (Goyal et al. 2017, Figure 1): the linear scaling rule with gradual warmup at
each k of the profile's list; every seed up to the profile's large k (they decide the flat region),
the first seed beyond."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lbsgd import experiments as ex
from lbsgd import studies
from lbsgd.findings import Finding
from lbsgd.studies import at_chance, mean, note
from lbsgd.studies.scales import Profile

STUDY = "batch_scaling"
TITLE = "3. Minibatch size (Goyal Fig. 1)"
FLAT_PCT = 2.0  # "flat": Goyal's errors from 128 to 8k lie within 0.3 points
RISE_PCT = 2.0  # "rises": the largest k more than this above k = 1


def small_batch(profile: Profile) -> int:
    """B_small of the noise probe (study 11): the profile's ``micro_batch`` if it is an integer,
    else its ``bn_batch`` (cpu and smoke: 16; cifar10 and imagenet, ``micro_batch=auto``: 32, which
    then caps the micro-batch at 32, a divisor of B_small)."""
    micro = profile.base.get("micro_batch")
    return (
        micro
        if isinstance(micro, int) and not isinstance(micro, bool)
        else profile.base["bn_batch"]
    )


def runs(
    profile: Profile,
    seeds: Sequence[int],
    ks: Sequence[float] | None = None,
    noise_scale: bool | None = None,
) -> list[dict[str, Any]]:
    """Each k of ``ks`` (default the profile's list): every seed up to ``large_k``, the first
    seed beyond.

    ``noise_scale`` (None: the profile's ``noise_in_batch_scaling``): each run also measures the
    gradient noise scale (``noise_scale=true``, ``noise_scale_batch`` = :func:`small_batch`; off
    where batch_size ≤ B_small, one batch size only: nothing to compare). These are study 11's
    runs: with it on, study 11 copies this sweep instead of training it again. The probe changes
    no digit of the training (tests/test_committed_results.py holds the cpu replay's twins to it)."""
    if noise_scale is None:
        noise_scale = profile.noise_in_batch_scaling
    b_small = small_batch(profile)
    out = []
    for k in ks or profile.ks[STUDY]:
        for s in seeds if k <= profile.large_k else seeds[:1]:
            keys = profile.keys(k=k, seed=s)
            if noise_scale:
                on = keys["batch_size"] > b_small
                keys = {**keys, "noise_scale": on, "noise_scale_batch": b_small if on else None}
            out.append(keys)
    return out


def table(df):
    """Mean error per k beside Figure 1 (k = batch / 256), rows of either side alone kept."""
    ours = ex.summarize(df.assign(k=df["k"].astype(float)), ["k", "batch_size"])
    paper = ex.reference(STUDY)[["batch", "value", "std"]].rename(
        columns={"batch": "paper_batch", "value": "paper_top1_error_pct", "std": "paper_std"}
    )
    paper["k"] = paper["paper_batch"] / 256
    t = ours.merge(paper, on="k", how="outer").sort_values("k").reset_index(drop=True)
    return t.astype(dict.fromkeys(("batch_size", "runs", "paper_batch"), "Int64"))  # no 4.1e+03


def findings(df, large_k: float) -> list[Finding]:
    """The error is flat up to ``large_k`` (the profile's; Goyal: 8k) and rises at the largest k.
    Decided over seeds (:mod:`lbsgd.studies`)."""
    s = _sweep(df, large_k)
    return [_flat(s), _rises(s)]


@dataclass(frozen=True)
class _Sweep:
    """What the claims read: the chance error, the ks, per k the errors by seed, their mean and
    the run's steps; the small ks (up to the large k); the published errors by batch, their
    source."""

    chance: float | None
    ks: list[float]
    e: dict[float, list[float]]
    err: dict[float, float]
    steps: dict[float, int]
    small: list[float]
    p: dict[int, float]
    src: str


def _sweep(df, large_k: float) -> _Sweep:
    ks = sorted(float(k) for k in df["k"].unique())
    e = {k: studies.errors(df, k=k) for k in ks}
    ref = ex.reference(STUDY)
    return _Sweep(
        chance=studies.chance_of(df),
        ks=ks,
        e=e,
        err={k: mean(v) for k, v in e.items()},
        steps={k: int(df[df["k"] == k]["total_steps"].iloc[0]) for k in ks},
        small=[k for k in ks if k <= large_k],  # Goyal: flat up to 8k, the ablations' large batch
        p=dict(zip(ref["batch"], ref["value"], strict=True)),
        src=studies.cite(*ref["source"]),
    )


def _flat(s: _Sweep) -> Finding:
    """The worst of the small k within 2 points of the best, judged by the spread of them all."""
    e, err, small = s.e, s.err, s.small
    best, worst = min(small, key=err.get), max(small, key=err.get)
    flat = err[worst] - err[best]
    v_flat = studies.within(
        e[worst],
        e[best],
        FLAT_PCT,
        chance=s.chance,
        seed_spread=studies.spread(*(e[k] for k in small)),
    )
    upto, last = _flat_up_to(err, small), max(small)
    against = not flat < FLAT_PCT and not at_chance([*e[worst], *e[best]], s.chance)
    why_flat = note(
        v_flat,
        against,
        (
            f"flat within {FLAT_PCT:g} points up to k={upto:g} ({s.steps[upto]} steps); k={last:g} "
            f"({s.steps[last]} steps; Goyal's 8k run: 14,076) is {err[last] - err[best]:.1f} points above "
            f"the best, k={best:g}: the step budget of a CPU run moves the knee to smaller k"
        ),
    )
    flat_p = [v for b, v in s.p.items() if b <= 8192]
    return studies.finding(
        f"the error is flat (within {FLAT_PCT:g} points) from k={min(small):g} to k={max(small):g}",
        v_flat,
        f"spread {flat:.1f} points (paper: flat from 128 to 8k, spread 0.3)" + why_flat,
        paper=f"{s.src}: {min(flat_p):.2f}% to {max(flat_p):.2f}% error from 128 to 8k (spread "
        f"{max(flat_p) - min(flat_p):.2f} points)",
    )


def _flat_up_to(err: dict[float, float], small: list[float]) -> float:
    """The largest k up to which the mean errors of the small ks stay within FLAT_PCT."""

    def width(top: float) -> float:  # the spread of the mean errors from the smallest k to top
        return max(err[j] for j in small if j <= top) - min(err[j] for j in small if j <= top)

    return max(k for k in small if width(k) < FLAT_PCT)


def _rises(s: _Sweep) -> Finding:
    """The error at the largest k more than RISE_PCT above the baseline's."""
    e, err, p = s.e, s.err, s.p
    base, top = (1.0 if 1.0 in e else s.ks[0]), s.ks[-1]
    return studies.finding(
        "the error rises at the largest minibatches",
        studies.worse_by(e[top], e[base], RISE_PCT, chance=s.chance),
        f"k={top:g}: {err[top]:.1f}% vs k={base:g}: {err[base]:.1f}% (paper 64k: "
        f"{p[65536]:.2f} vs {p[256]:.2f})",
        paper=f"{s.src}: {p[65536]:.2f}% error at 64k vs {p[256]:.2f}% at 256 ({p[16384]:.2f}% at "
        f"16k, {p[32768]:.2f}% at 32k)",
    )
