"""1. Quickstart: one run of the profile at k = 16 (the minibatch 16 times the reference batch) with
the linear scaling rule and gradual warmup; it shows where a run's numbers live."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies.scales import Profile

STUDY = "quickstart"
TITLE = "1. Quickstart"
COLUMNS = [
    "run",
    "k",
    "batch_size",
    "lr",
    "final_top1_error_pct",
    "final_top5_error_pct",
    "img_per_s",
]
# "learns": top-1 error this many points below chance. One run, no seed spread: a run beyond this
# allowance has learned whatever its seed (a cpu run's seed spread is ~2 points); one inside it is
# undecided, as is one at chance (smoke: too few steps to say); one that diverged has not learned.
LEARNS_PCT = 20.0


def runs(profile: Profile, seeds: Sequence[int], k: float = 16) -> list[dict[str, Any]]:
    """One run at ``k`` with the profile's keys and the first seed."""
    return [profile.keys(k=k, seed=seeds[0])]


def table(df):
    """The run's minibatch, learning rate, errors and throughput."""
    return df[COLUMNS]


def paper() -> str:
    """Goyal's run of the same recipe (Table 1, gradual warmup at 8k): the claim itself, that the
    run learns, is a check of lbsgd's, with no published number."""
    ref = ex.reference("warmup")
    r = ref[(ref["warmup"] == "gradual") & (ref["batch"] == ref["batch"].max())].iloc[0]
    return (
        f"{studies.cite(r['source'])}: the linear rule with gradual warmup at "
        f"{studies.kilo(r['batch'])} trains to {r['value']:.2f}% error (the claim itself is "
        "lbsgd's check)"
    )


def findings(df) -> list[Finding]:
    """The run learns: its top-1 error is over 20 points below chance (see :data:`LEARNS_PCT`;
    diverged: not; chance unknown: undecided)."""
    err = studies.errors(df)[0]
    chance = studies.chance_of(df)
    evidence = f"top-1 error {err:.1f}%"
    if (df["status"] == "diverged").any():
        verdict = studies.Verdict(False)
        evidence = f"the run diverged ({evidence} at its last evaluation)"
    elif chance is None:
        verdict = studies.Verdict(None, "the dataset's chance error is unknown")
    else:
        # one run against a number (chance): no test; the allowance of LEARNS_PCT points plays
        # the part of an interval, and a run short of it is undecided, not "not replayed"
        why = (
            f"one run, {chance - err:.1f} points below chance (the claim: over {LEARNS_PCT:g}): "
            "no seed spread to judge it by"
        )
        verdict = studies.Verdict(True) if chance - err > LEARNS_PCT else studies.Verdict(None, why)
        evidence += (
            f" vs chance {chance:.0f}% (the claim: over {LEARNS_PCT:g} points below it, under "
            f"{chance - LEARNS_PCT:.0f}%)"
        )
    claim = "a large-minibatch run with the linear rule and gradual warmup learns"
    return [studies.finding(claim, verdict, evidence, paper=paper())]
