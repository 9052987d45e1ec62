"""Findings: a paper's claim, whether this replay shows it, and the evidence, in one place.

- :class:`Finding` and the study's file of them, ``findings.json`` (:func:`write`, :func:`read`),
  which ``lbsgd report`` gathers and ``lbsgd verify`` compares.
- The verdict: :func:`verdict` decides a claim from the per-seed errors of the arms it compares.
  It is ``undecided`` (never "replayed") when its evidence cannot decide it: every run at chance,
  one run per arm (no seed spread to judge the margin by), or a margin inside the seed spread; the
  evidence then says which.
- The verdict's words, one set (:data:`LABELS`) shown three ways: :func:`label` (W&B's findings
  table, the report's counts), :func:`loud` (the line a notebook prints) and :func:`answer`
  (REPORT.md's "replayed" column, the "no" in bold).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A study's file of findings, in its folder ``results/<profile>/<study>/``.
FILE = "findings.json"

# A run is "at chance" when its top-1 error is within this many points of 100·(1 − 1/classes):
# at the smoke profile every run ends at 86-91% on 10 classes (chance 90%).
CHANCE_MARGIN_PCT = 5.0

# -- the verdict's words -----------------------------------------------------------------------

# replayed (True, False, or None: undecided) in words
LABELS: Mapping[bool | None, str] = {True: "replayed", False: "not replayed", None: "undecided"}
# the same, as the answer of REPORT.md's column "replayed"
ANSWERS: Mapping[bool | None, str] = {True: "yes", False: "no", None: "undecided"}


def label(replayed: bool | None) -> str:
    """ "replayed", "not replayed" or "undecided"."""
    return LABELS[replayed]


def loud(replayed: bool | None) -> str:
    """The label with a not-replayed claim's "not" in capitals ("NOT replayed"): the line a
    notebook prints for each finding."""
    return LABELS[replayed].replace("not ", "NOT ")


def answer(replayed: bool | None) -> str:
    """REPORT.md's answer in markdown: "yes", "**no**" (bold: what a reader looks for) or
    "undecided"."""
    word = ANSWERS[replayed]
    return f"**{word}**" if replayed is False else word


# -- a finding and its file --------------------------------------------------------------------


@dataclass
class Finding:
    """A qualitative claim of a paper, and whether this replay shows it (None: not decidable).
    ``paper``: what the paper reports for the claim, with its source (table, figure), e.g.
    "Goyal Table 1: gradual 23.74% vs none 24.84% (8k)"; "" where not given."""

    claim: str
    replayed: bool | None
    evidence: str
    paper: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "replayed": self.replayed,
            "evidence": self.evidence,
            "paper": self.paper,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """A finding of ``findings.json``; one written before ``paper`` existed reads as ""."""
        return cls(d["claim"], d["replayed"], d["evidence"], d.get("paper", ""))


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
    path.write_text(json.dumps(record, indent=2) + "\n")
    for f in findings:
        print(f"{loud(f.replayed):>12}: {f.claim} ({f.evidence})")
    return path


def read(path: str | os.PathLike) -> dict[str, Any]:
    """A ``findings.json`` as written (study, title, profile, seeds, findings as dicts)."""
    return json.loads(Path(path).read_text())


def files(profile_dir: str | os.PathLike) -> list[Path]:
    """The ``findings.json`` of each study of a profile's folder, by study folder name."""
    return sorted(Path(profile_dir).glob(f"*/{FILE}"))


# -- the verdict -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Whether the evidence shows a claim (None: it cannot decide), and why when undecided."""

    replayed: bool | None
    why: str = ""

    def text(self) -> str:
        """``"; undecided: …"`` to append to a finding's evidence (empty when decided)."""
        return f"; undecided: {self.why}" if self.replayed is None else ""


def spread(*arms: Sequence[float]) -> float | None:
    """The seed spread of a comparison: the largest sample standard deviation over the seeds of
    one arm (None when no arm has two runs)."""
    sds = [statistics.stdev(a) for a in arms if len(a) >= 2]
    return max(sds) if sds else None


def verdict(
    x: Sequence[float],
    y: Sequence[float],
    *,
    more_than: float | None = None,
    at_most: float | None = None,
    chance: float | None = None,
    seed_spread: float | None = None,
    paired: bool = False,
) -> Verdict:
    """The claim ``mean(x) − mean(y) > more_than`` (or ``≤ at_most``), decided from per-seed values
    (top-1 errors in %, one per seed) of two arms.

    ``paired``: ``x[i]`` and ``y[i]`` come from the same seed (the same initialisation and data
    order, as every study's arms do), so the spread that judges the margin is that of the
    per-seed differences ``x[i] − y[i]``: the seed's own luck cancels, as in a paired t-test.

    Undecided when
    - every run of both arms is at ``chance`` (within :data:`CHANCE_MARGIN_PCT`), or
    - there are not two seeds to measure a spread from (two per arm; two pairs when ``paired``)
      and no ``seed_spread`` is given (a spread measured elsewhere in the study, e.g. the
      baseline's), so the margin cannot be judged, or
    - the margin, the distance of ``mean(x) − mean(y)`` from the threshold, is no larger than the
      seed spread (sample standard deviation over seeds: of the differences when ``paired``, else
      the larger of the arms'; ``seed_spread`` when given). The evidence then says what would
      decide it: :func:`seeds_to_decide` for a test of the mean, since this rule's threshold does
      not shrink with seeds.
    """
    if (more_than is None) == (at_most is None):
        raise ValueError("verdict: give exactly one of more_than= or at_most=")
    if not x or not y:
        raise ValueError("verdict: each arm needs at least one value")
    early = _no_evidence([*x, *y], chance)
    if early is not None:
        return early
    diff = statistics.fmean(x) - statistics.fmean(y)
    threshold = more_than if more_than is not None else at_most
    s = _seed_spread(x, y, seed_spread, paired)
    if s is None:
        return Verdict(None, "one seed per arm: no seed spread to judge the margin by")
    over = "of the per-seed differences" if paired and seed_spread is None else "over seeds"
    return _by_margin(diff, threshold, s, more_than is not None, over)


def _by_margin(diff: float, threshold: float, s: float, above: bool, over: str) -> Verdict:
    """``diff > threshold`` (``above``) or ``diff ≤ threshold``, undecided when the margin is
    inside the seed spread ``s`` (a standard deviation ``over`` what it says)."""
    margin = abs(diff - threshold)
    if margin <= s:
        return Verdict(
            None,
            f"the margin ({margin:.2f} points) is inside the seed spread "
            f"({s:.2f} points, standard deviation {over}); {_what_would_decide(margin, s)}",
        )
    return Verdict(diff > threshold if above else diff <= threshold)


def _no_evidence(vals: Sequence[float], chance: float | None) -> Verdict | None:
    """Undecided before any margin: a run without a finite result, or every run at ``chance``."""
    if any(not math.isfinite(v) for v in vals):
        return Verdict(None, "a run has no finite result")
    if chance is not None and all(v >= chance - CHANCE_MARGIN_PCT for v in vals):
        return Verdict(None, f"every run is at chance ({chance:.0f}% error)")
    return None


def _seed_spread(
    x: Sequence[float], y: Sequence[float], given: float | None, paired: bool
) -> float | None:
    """The spread that judges a margin: ``given``, else the per-seed differences' when
    ``paired``, else the larger arm's (None: fewer than two seeds to measure it)."""
    if paired and len(x) != len(y):
        raise ValueError(
            f"verdict: paired arms need one value per seed each ({len(x)} vs {len(y)})"
        )
    if given is not None:
        return given
    if paired:
        diffs = [a - b for a, b in zip(x, y, strict=True)]
        return statistics.stdev(diffs) if len(diffs) >= 2 else None
    return spread(x, y)


def seeds_to_decide(margin: float, s: float) -> int | None:
    """Seeds a test of two standard errors would need to decide a margin ``margin`` at the seed
    spread ``s``: the smallest n with ``margin > 2·s/√n``, i.e. ``n > 4·(s/margin)²``. None when
    the margin is 0 (no number of seeds separates equal means)."""
    if margin <= 0:
        return None
    return math.floor(4 * (s / margin) ** 2) + 1


def _what_would_decide(margin: float, s: float) -> str:
    """The undecided verdict's last clause: the rule (margin > spread) asks for an effect larger
    than one seed's spread, which more seeds do not make; what would decide the claim is a scale
    where the effect grows (a larger k, more epochs), or, under a test of the mean (two standard
    errors), this many seeds."""
    n = seeds_to_decide(margin, s)
    test = "no number of seeds" if n is None else f"{n} seeds"
    return (
        "the rule asks for an effect larger than the seed spread, which more seeds do not give: "
        f"a scale where the effect grows would decide it (a two-standard-error test of the mean: {test})"
    )
