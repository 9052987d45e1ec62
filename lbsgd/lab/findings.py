"""Findings: a paper's claim, whether this replay shows it, and the evidence, in one place.

:class:`Finding` and a study's ``findings.json`` (:func:`write`, :func:`files`), gathered by
``lbsgd report`` and compared by ``lbsgd verify``; :func:`verdict` decides a claim from the
per-seed errors of its arms, ``undecided`` (never "replayed") where the evidence cannot decide it;
:func:`contrast` is one claim with three outcomes. The outcome's words are one set
(:data:`OUTCOMES`), shown by :func:`loud` (a notebook's line) and :func:`answer` (REPORT.md's
column). How a claim is decided: docs/verdicts.md.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lbsgd import rundir
from lbsgd.lab import stats

# A study's file of findings, in its folder ``results/<profile>/<study>/``.
FILE = "findings.json"

# A run is "at chance" when its top-1 error is within this many points of 100·(1 − 1/classes):
# at the smoke profile every run ends at 86-91% on 10 classes (chance 90%).
CHANCE_MARGIN_PCT = 5.0

# -- the verdict's words -----------------------------------------------------------------------

# replayed (True, False, or None: undecided) in words, for a claim decided by a test
LABELS: Mapping[bool | None, str] = {True: "replayed", False: "not replayed", None: "undecided"}

# every outcome a claim can have, in the order the reports count them: *measured* is a claim
# decided from a number beside its threshold with no test (a fitted ratio, one run, a cost
# model), which no interval backs, so it is counted apart from the tested verdicts
OUTCOMES = ("replayed", "not replayed", "undecided", "invalid", "measured")
# the outcomes of a test that decided (what budget-bound and false-discovery control count)
DECIDED = ("replayed", "not replayed")
# each outcome as the answer of REPORT.md's column "replayed": a "no" in bold, what a reader
# looks for; a measured claim neither yes nor no
ANSWERS: Mapping[str, str] = {
    "replayed": "yes",
    "not replayed": "**no**",
    "undecided": "undecided",
    "invalid": "invalid",
    "measured": "measured",
}


def loud(outcome: str) -> str:
    """The outcome with a not-replayed claim's "not" in capitals ("NOT replayed"), an invalid
    one in capitals: the line a notebook prints for each finding."""
    return "INVALID" if outcome == "invalid" else outcome.replace("not ", "NOT ")


def answer(outcome: str, budget_bound: bool = False) -> str:
    """REPORT.md's answer in markdown (:data:`ANSWERS`); a verdict of a test from an arm under
    S_min adds "budget-bound"."""
    word = ANSWERS[outcome]
    return f"{word}, budget-bound" if budget_bound and outcome in DECIDED else word


# -- a finding and its file --------------------------------------------------------------------


class _Decided:
    """What a :class:`Finding` and a :class:`Verdict` both say from their fields ``replayed``,
    ``invalid``, ``p_for`` and ``p_against``: the outcome in words and the claim's p."""

    replayed: bool | None
    invalid: bool
    p_for: float | None
    p_against: float | None

    @property
    def outcome(self) -> str:
        """One of :data:`OUTCOMES`: "invalid" (an arm did not train), "measured" (decided with
        no test: both p's None; ``replayed`` still says which side of its threshold the number
        fell), else the test's "replayed", "not replayed" or "undecided"."""
        if self.invalid:
            return "invalid"
        if self.replayed is not None and self.p_for is None and self.p_against is None:
            return "measured"
        return LABELS[self.replayed]

    @property
    def decided(self) -> bool:
        """Decided by a test: "replayed" or "not replayed"."""
        return self.outcome in DECIDED

    @property
    def p(self) -> float | None:
        """The claim's p: the smallest level at which its interval decides it (None: no test)."""
        if self.p_for is None or self.p_against is None:
            return None
        return min(self.p_for, self.p_against)


@dataclass
class Finding(_Decided):
    """A qualitative claim of a paper, and whether this replay shows it (None: not decided).
    ``paper``: what the paper reports for the claim, with its source (table, figure), e.g.
    "Goyal Table 1: gradual 23.74% vs none 24.84% (8k)"; "" where not given. ``invalid``: a
    comparison with an arm that did not train (``replayed`` is then None). ``p_for`` and
    ``p_against``: its test's two p's (:class:`lbsgd.lab.stats.Test`; None for a claim decided
    without a test), which the report's false-discovery control reads. ``budget``: the
    optimizer steps of its arms beside the profile's S_min and the paper's (:class:`Budget`)."""

    claim: str
    replayed: bool | None
    evidence: str
    paper: str = ""
    invalid: bool = False
    p_for: float | None = None
    p_against: float | None = None
    budget: Budget | None = None

    @property
    def budget_bound(self) -> bool:
        return self.budget is not None and self.budget.bound

    @property
    def answer(self) -> str:
        """REPORT.md's answer (:func:`answer`)."""
        return answer(self.outcome, self.budget_bound)

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "replayed": self.replayed,
            "outcome": self.outcome,
            "evidence": self.evidence,
            "paper": self.paper,
            "p_for": self.p_for,
            "p_against": self.p_against,
            "budget": None if self.budget is None else self.budget.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """A finding of ``findings.json``; fields a file written before them lacks read as
        empty (no paper, no test, no budget)."""
        budget = d.get("budget")
        return cls(
            d["claim"],
            d["replayed"],
            d["evidence"],
            d.get("paper", ""),
            d.get("outcome") == "invalid",
            d.get("p_for"),
            d.get("p_against"),
            None if budget is None else Budget.from_dict(budget),
        )


@dataclass(frozen=True)
class Budget:
    """The optimizer steps of a large-minibatch claim's arms (``steps``: arm → steps) beside the
    profile's S_min (the fewest steps any batch needs to reach study 11's target loss, in its
    fit; None where the profile has none) and the paper's run (``paper``: in words, e.g.
    "Goyal's 8k run: 14,076"). A verdict from an arm with fewer steps than S_min is
    *budget-bound*: it says what this budget allows, not what the batch size does."""

    steps: Mapping[str, int]
    s_min: float | None
    paper: str = ""
    s_min_target: str = ""  # the target S_min is for, in words (the profile's)

    @property
    def bound(self) -> bool:
        return self.s_min is not None and min(self.steps.values()) < self.s_min

    def text(self) -> str:
        arms = ", ".join(f"{arm} {n:,}" for arm, n in self.steps.items())
        out = f"optimizer steps: {arms}"
        to = f" (to {self.s_min_target})" if self.s_min_target else ""
        out += (
            f"; S_min {self.s_min:,.0f}{to}"
            if self.s_min is not None
            else "; no S_min at this profile"
        )
        out += f"; {self.paper}" if self.paper else ""
        if self.bound:
            out += "; budget-bound: an arm has fewer steps than S_min"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": dict(self.steps),
            "s_min": self.s_min,
            "s_min_target": self.s_min_target,
            "paper": self.paper,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Budget:
        return cls(dict(d["steps"]), d.get("s_min"), d.get("paper", ""), d.get("s_min_target", ""))


def write(
    study_dir: str | os.PathLike,
    study: str,
    profile: str,
    seeds: Sequence[int],
    findings: Sequence[Finding],
    title: str = "",
) -> Path:
    """``<study_dir>/findings.json`` of a study, what the report gathers; prints each verdict."""
    path = Path(study_dir) / FILE
    record = {
        "study": study,
        "title": title or study,
        "profile": profile,
        "seeds": list(seeds),
        "findings": [f.to_dict() for f in findings],
    }
    with rundir.replacing(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
    for f in findings:
        print(f"{loud(f.outcome):>12}: {f.claim} ({f.evidence})")
    return path


def files(profile_dir: str | os.PathLike) -> list[Path]:
    """The ``findings.json`` of each study of a profile's folder, by study folder name."""
    return sorted(Path(profile_dir).glob(f"*/{FILE}"))


# -- the verdict -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict(_Decided):
    """Whether the evidence shows a claim: ``replayed`` True or False when its test decides it at
    :data:`lbsgd.lab.stats.ALPHA`, None when it does not, or when the comparison is ``invalid`` (an
    arm did not train); ``why`` says why in both cases. ``test``: the interval(s) in words;
    ``p_for``/``p_against``: the test's p of each side (:class:`lbsgd.lab.stats.Test`; None without a
    test), which the report's false-discovery control reads."""

    replayed: bool | None
    why: str = ""
    invalid: bool = False
    test: str = ""
    p_for: float | None = None
    p_against: float | None = None

    def text(self) -> str:
        """What to append to a finding's evidence: the test, then the reason when undecided or
        invalid."""
        out = f"; {self.test}" if self.test else ""
        if self.invalid:
            return out + f"; invalid: {self.why}"
        return out + (f"; undecided: {self.why}" if self.replayed is None else "")


def decide(p_for: float, p_against: float, test: str, why: str = "") -> Verdict:
    """The verdict of a test's two p's at :data:`lbsgd.lab.stats.ALPHA`; ``why``: the reason when it
    decides neither way."""
    replayed = True if p_for < stats.ALPHA else False if p_against < stats.ALPHA else None
    why = why if replayed is None else ""
    return Verdict(replayed, why, test=test, p_for=p_for, p_against=p_against)


def diverged(value: float, chance: float | None = None) -> bool:
    """A run that diverged: no finite result or, for top-1 errors (``chance`` given), one counted
    as 100% error (:func:`lbsgd.lab.studies.rules.diverged_as_failed`). Other values (a loss gap in %,
    a change in points) can exceed 100 without anything having diverged."""
    return not math.isfinite(value) or (chance is not None and value >= 100.0)


def untrained(arm: Sequence[float], chance: float | None) -> str | None:
    """Why an arm did not train (a run diverged, or its mean is within
    :data:`CHANCE_MARGIN_PCT` of ``chance``), or None when it trained."""
    failed = sum(diverged(v, chance) for v in arm)
    if failed:
        return f"{failed} of its {len(arm)} runs diverged"
    if chance is not None and statistics.fmean(arm) >= chance - CHANCE_MARGIN_PCT:
        return (
            f"its mean error {statistics.fmean(arm):.1f}% is within {CHANCE_MARGIN_PCT:g} "
            f"points of chance ({chance:.0f}%)"
        )
    return None


def verdict(
    x: Sequence[float],
    y: Sequence[float],
    *,
    more_than: float | None = None,
    less_than: float | None = None,
    within: float | None = None,
    chance: float | None = None,
    paired: bool = False,
    may_fail: str = "",
    unit: str = "points",
) -> Verdict:
    """The claim about ``d = mean(x) − mean(y)`` (per-seed values of two arms, top-1 errors in %
    unless ``unit`` says otherwise): ``d > more_than``, ``d < less_than``, or, a closeness
    claim, ``|d| < within`` (an equivalence margin). Decided by the two-sided 95% interval of
    ``d`` (:mod:`lbsgd.lab.stats`): Student's on the per-seed differences when ``paired`` (``x[i]``,
    ``y[i]`` from seed i: the seed's own luck cancels), else Welch's; with one run in an arm,
    Student's pooled interval (that run taken to share the other arm's spread). Replayed when the
    interval lies wholly on the claim's side (inside the margin), not replayed when wholly on the
    other (outside it), undecided otherwise, and then the evidence says how many seeds would give
    80% power if the true effect were the one observed.

    Invalid, before any test, when an arm did not train (:func:`untrained`: a run diverged, or
    its mean within 5 points of ``chance``); ``may_fail`` ("x" or "y") names an arm that the claim
    itself says fails (a collapse), which is then not held to it.
    """
    if sum(v is not None for v in (more_than, less_than, within)) != 1:
        raise ValueError("verdict: give exactly one of more_than=, less_than= or within=")
    early = _before_the_test(x, y, chance, paired, may_fail)
    if early is not None:
        return early
    if within is not None:
        t = stats.equivalent(x, y, within, paired=paired)
        threshold, bounds = within, f"the margin ±{within:g}"
    elif more_than is not None:
        t = stats.above(x, y, more_than, paired=paired)
        threshold, bounds = more_than, f"the threshold {more_than:+g}"
    else:
        t = stats.below(x, y, less_than, paired=paired)
        threshold, bounds = less_than, f"the threshold {less_than:+g}"
    iv = t.interval
    why = f"the interval reaches across {bounds}" + _seeds_clause(
        x, y, iv.diff, threshold, within, paired
    )
    return decide(t.p_for, t.p_against, f"Δ {iv.text(unit)}, p = {t.p:.3g}", why)


def _before_the_test(x, y, chance: float | None, paired: bool, may_fail: str) -> Verdict | None:
    """The verdict that comes before any interval: invalid (an arm did not train, unless the
    claim says it fails: ``may_fail``), or undecided (no finite result, or one run per arm); None
    when the arms can be tested."""
    if len(x) == 0 or len(y) == 0:
        raise ValueError("verdict: each arm needs at least one value")
    if paired and len(x) != len(y):
        raise ValueError(
            f"verdict: paired arms need one value per seed each ({len(x)} vs {len(y)})"
        )
    failed = [
        why
        for name, arm in (("x", x), ("y", y))
        if name not in may_fail and (why := untrained(arm, chance))
    ]
    if failed:
        return Verdict(None, f"an arm did not train ({failed[0]})", invalid=True)
    if any(not math.isfinite(v) for v in (*x, *y)):
        return Verdict(None, "a run has no finite result")
    if max(len(x), len(y)) < 2:
        return Verdict(None, "one run per arm: no interval to judge the difference by")
    return None


def contrast(
    a: Sequence[float],
    b: Sequence[float],
    *,
    margin: float,
    expect: str,
    names: tuple[str, str] = ("a", "b"),
    chance: float | None = None,
    paired: bool = False,
    unit: str = "points",
) -> Verdict:
    """One contrast of two arms as one claim with three outcomes (:func:`lbsgd.lab.stats.contrast`),
    on ``Δ = mean(b) − mean(a)`` (per-seed values where lower is better, top-1 errors in % unless
    ``unit`` says otherwise: above 0, ``a`` is better): ``a`` *matches* ``b`` when the 95%
    interval of Δ lies inside ±``margin`` (two one-sided tests, as :func:`verdict`'s ``within``),
    else *beats* it when the interval lies wholly above 0, else *loses* to it when wholly below;
    undecided otherwise. The claim is that the outcome is ``expect`` (the one its paper
    expects): replayed when that outcome is decided, not replayed when another is. Invalid, as
    :func:`verdict`, when an arm did not train. ``names``: the arms in the evidence's words
    ("outcome: LARS loses to Nesterov (interval wholly below 0, not inside ±1)")."""
    early = _before_the_test(a, b, chance, paired, "")
    if early is not None:
        return early
    c = stats.contrast(b, a, margin, paired=paired)
    t = c.test(expect)
    iv = c.interval
    words = (
        f"Δ {iv.diff:+.2f} {unit} ({names[1]} − {names[0]}), 95% CI [{iv.low:+.2f}, "
        f"{iv.high:+.2f}] ({iv.test}, n = {iv.n}), p = {t.p:.3g}"
    )
    if c.outcome is not None:
        words += f"; outcome: {_CONTRAST_WORDS[c.outcome].format(*names, margin)}"
    # the seeds to decide the outcome nearer at hand: matches (from the margin) or a side (from 0)
    near = abs(iv.diff) < margin / 2
    why = f"the interval covers 0 and is not inside ±{margin:g}" + _seeds_clause(
        a, b, iv.diff, 0.0, margin if near else None, paired
    )
    return decide(t.p_for, t.p_against, words, why)


# each outcome of :func:`contrast` in words, from its arms' names and the margin
_CONTRAST_WORDS = {
    "matches": "{0} matches {1} (interval inside ±{2:g})",
    "beats": "{0} beats {1} (interval wholly above 0, not inside ±{2:g})",
    "loses": "{0} loses to {1} (interval wholly below 0, not inside ±{2:g})",
}


def _seeds_clause(x, y, diff: float, threshold: float, within: float | None, paired: bool) -> str:
    """How many seeds would give 80% power if the true difference were the one observed: its
    distance from the threshold (from the nearer margin bound for a closeness claim)."""
    if within is not None:
        effect = within - abs(diff) if abs(diff) < within else abs(diff) - within
    else:
        effect = abs(diff - threshold)
    if paired:
        sd = statistics.stdev([a - b for a, b in zip(x, y, strict=True)])
    else:
        sd = max(statistics.stdev(a) for a in (x, y) if len(a) >= 2)
    n = stats.seeds_to_decide(effect, sd, paired=paired)
    if n is None:
        return "; no number of seeds decides a difference that sits on it"
    per = "pairs of seeds" if paired else "seeds per arm"
    return (
        f"; were the true effect the observed {effect:.2f} at this spread ({sd:.2f}), 80% power "
        f"would take {n} {per}"
    )


def with_s_min(f: Finding, s_min: float | None, target: str = "") -> Finding:
    """``f`` with its budget's S_min (the profile's) and the budget in its evidence: the
    session completes a study's findings so (a study's rules know the arms' steps, the profile
    knows S_min). A finding without a budget passes unchanged."""
    if f.budget is None:
        return f
    budget = replace(f.budget, s_min=s_min, s_min_target=target)
    return replace(f, budget=budget, evidence=f"{f.evidence}; {budget.text()}")


# -- a report's claims together ----------------------------------------------------------------


def controlled(found: Sequence[Finding]) -> list[Finding]:
    """A report's findings with false verdicts controlled across them: Benjamini–Hochberg at
    false-discovery rate α (:data:`lbsgd.lab.stats.ALPHA`) over every tested, valid claim
    (docs/verdicts.md says why BH and not Holm). A tested claim stays decided only when its
    adjusted p (q) is below α, else it becomes undecided; each tested claim's evidence gains its
    q. Claims with no test (*measured*, e.g. a cost model's number; or undecided for want of
    data) and invalid ones pass unchanged."""
    tested = [i for i, f in enumerate(found) if f.p is not None and not f.invalid]
    qs = dict(zip(tested, stats.bh_adjusted([found[i].p for i in tested]), strict=True))
    out = list(found)
    for i, q in qs.items():
        f, text = found[i], f"BH q = {q:.3g} over {len(tested)} tested claims"
        undecided = f.replayed is not None and q >= stats.ALPHA
        if undecided:
            text = f"undecided after false-discovery control: {text}"
        replayed = None if undecided else f.replayed
        out[i] = replace(f, replayed=replayed, evidence=f"{f.evidence}; {text}")
    return out


def counts(found: Sequence[Finding]) -> str:
    """ "39 claims: 14 replayed, 4 not replayed, 17 undecided, 2 invalid, 2 measured (one number
    beside its threshold, no test); 6 of the 18 decided are budget-bound": the report's
    headline. Budget-bound counts the verdicts of a test (:data:`DECIDED`)."""
    outcomes = [f.outcome for f in found]
    out = f"{len(found)} claims: " + ", ".join(f"{outcomes.count(o)} {o}" for o in OUTCOMES)
    out += " (one number beside its threshold, no test)"
    decided = [f for f in found if f.decided]
    bound = sum(f.budget_bound for f in decided)
    return out + f"; {bound} of the {len(decided)} decided are budget-bound (an arm under S_min)"
