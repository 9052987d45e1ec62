"""``lbsgd report``: each profile's findings and tables gathered into ``<profile>/REPORT.md``.

The report is made from each study's ``findings.json`` and ``table.csv`` only (its numbers are the
runs' own, shown rounded by :func:`lbsgd.lab.experiments.readable_cell`; profiles never mixed).
``--side-by-side`` prints several profiles' findings in one table instead (:func:`side_by_side`).
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from lbsgd import rundir
from lbsgd.lab import findings as fs
from lbsgd.lab.experiments import readable_cell, results
from lbsgd.lab.findings import Finding


def _table_markdown(path: Path, max_rows: int = 40) -> str:
    """The CSV as a markdown table, its numbers rounded for reading
    (:func:`lbsgd.lab.experiments.readable_cell`; the CSV keeps every digit)."""
    with path.open() as f:
        rows = list(csv.reader(f))
    if not rows:
        return ""
    head, body = rows[0], rows[1 : max_rows + 1]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [
        "| " + " | ".join(readable_cell(c, v) for c, v in zip(head, r, strict=False)) + " |"
        for r in body
    ]
    if len(rows) - 1 > max_rows:
        lines.append(f"\n({len(rows) - 1 - max_rows} more rows in {path.name})")
    return "\n".join(lines)


def _order(study: dict) -> tuple[int, str]:
    head = study.get("title", "").split(".")[0]
    return (int(head) if head.isdigit() else 10**6, study["dir"].name)


def _cell(text: str) -> str:
    """A table cell: a '|' or a line break in the text would end it."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _profile_studies(
    profile_dir: Path, none: str = "not a profile's folder (results/cpu)"
) -> dict[str, dict]:
    """A profile folder's studies by folder name in reading order, each with its findings as
    :class:`Finding` under the report's false-discovery control
    (:func:`lbsgd.lab.findings.controlled`, over every claim of the folder); ``none``: what the
    error says when it holds no study."""
    studies = [{**json.loads(p.read_text()), "dir": p.parent} for p in fs.files(profile_dir)]
    if not studies:
        raise FileNotFoundError(f"no */findings.json under {str(profile_dir)!r}: {none}")
    studies.sort(key=_order)  # reading order: the titles start with the notebook's number
    found = fs.controlled([Finding.from_dict(f) for s in studies for f in s["findings"]])
    for s in studies:
        n = len(s["findings"])
        s["findings"], found = found[:n], found[n:]
    return {s["dir"].name: s for s in studies}


def build(profile_dir: str | os.PathLike) -> str:
    """The markdown of one profile's folder (``results/<profile>``); links relative to it."""
    root = Path(profile_dir)
    studies = list(_profile_studies(root, "run the notebooks first").values())
    out = _head(studies)
    out += ["| study | seeds | claim | replayed | evidence |", "|---|---|---|---|---|"]
    out += [
        f"| [{_cell(s['title'])}](#{_anchor(s['title'])}) | {len(s['seeds'])} | "
        f"{_cell(f.claim)} | {f.answer} | {_cell(f.evidence)} |"
        for s in studies
        for f in s["findings"]
    ]
    for s in studies:
        out += _section(s)
    out += _beside(root)
    return "\n".join(out) + "\n"


def _beside(root: Path) -> list[str]:
    """The section that sets this profile's verdicts beside those of the profiles its profile
    sets beside its own (:attr:`lbsgd.lab.studies.scales.Profile.beside`, those that hold
    findings; every claim), then each claim whose outcome differs, with each profile's budget:
    the optimizer steps of its arms against its S_min."""
    from lbsgd.lab.studies import scales

    profile = scales.PROFILES.get(root.name)
    names = profile.beside if profile is not None else ()
    others = [d for d in (root.parent / n for n in names) if fs.files(d)]
    if not others:
        return []
    dirs = [root, *others]
    out = [
        "",
        f"## Beside {', '.join(f'`{d.name}`' for d in others)}",
        "",
        f"The verdicts of {', '.join(f'`{d.name}`' for d in dirs)} side by side (`lbsgd report "
        f"--side-by-side {' '.join(f'{d.parent.name}/{d.name}' for d in dirs)} --verdicts`; "
        "without `--verdicts`, "
        "with every evidence):",
        "",
        side_by_side(dirs, verdicts_only=True),
        "Where the outcome differs, each profile's budget (its arms' optimizer steps beside its "
        "S_min) says whether the budget is why:",
        "",
    ]
    rows = _rows([_profile_studies(d) for d in dirs])
    return out + [_differing(dirs, row) for _, row in rows if _differs(row)]


def _rows(per: list[dict[str, dict]]) -> list[tuple[str, list[Finding | None]]]:
    """Every claim across the profiles (``per``: each profile's studies by folder name), with
    its study's title (the first profile's that has it): the studies in reading order, each
    study's claims matched across the profiles (:func:`_matched`)."""
    names = {name: s for studies in reversed(per) for name, s in studies.items()}
    return [
        (names[name]["title"], row)
        for name in sorted(names, key=lambda n: _order(names[n]))
        for row in _matched([studies.get(name) for studies in per])
    ]


def _differs(row: list[Finding | None]) -> bool:
    have = [f for f in row if f is not None]
    return len(have) >= 2 and len({f.outcome for f in have}) > 1


def _differing(dirs: list[Path], row: list[Finding | None]) -> str:
    """A claim whose outcome differs across the profiles: each one's verdict and budget."""
    have = [(d, f) for d, f in zip(dirs, row, strict=True) if f is not None]
    parts = [
        f"`{d.name}` {f.answer} ({f.budget.text() if f.budget else 'no budget'})" for d, f in have
    ]
    return f"- {_cell(have[0][1].claim)}: " + "; ".join(parts)


def _head(studies: list[dict]) -> list[str]:
    """The report's title, what it is generated from and how a claim is decided, the count of
    each outcome, and a warning when the folder mixes profiles."""
    profiles = sorted({str(s.get("profile")) for s in studies})
    found = [f for s in studies for f in s["findings"]]
    out = [
        f"# lbsgd: the large-minibatch studies, replayed (profile `{', '.join(profiles)}`)",
        "",
        "Generated by `lbsgd report` from `*/findings.json` and `*/table.csv` in this folder; "
        "every number comes from the runs in `<study>/`. A claim is decided by the 95% "
        "confidence interval of its difference over seeds (paired t; Welch's for unpaired "
        "arms): *replayed* when the interval lies wholly on the claim's side of its threshold "
        "(inside the margin of a closeness claim: two one-sided tests at 2.5% each, stricter than "
        "the conventional 5% TOST and its 90% interval), *not replayed* when wholly on the other "
        "side, *undecided* otherwise; false verdicts are controlled over the report's tested "
        "claims by Benjamini–Hochberg at 5% (each evidence gives its interval, p and q). "
        "*Invalid*: an arm of the comparison did not train (within 5 points of chance, or a "
        "run diverged). *Measured*: a claim decided from a number beside its threshold with no "
        "test (a fitted ratio, one run, a cost model): its evidence shows both, it is neither "
        "yes nor no and is counted apart. *Budget-bound*: a large-minibatch verdict from an "
        "arm with fewer optimizer steps than S_min, the fewest any batch needs to reach the "
        "target each evidence names beside it (study 11's training loss; study 15's held-out "
        "error where the profile replays study 15). docs/verdicts.md explains the rule.",
        "",
        f"{fs.counts(found)}.",
        "",
    ]
    if len(profiles) > 1:
        out += [
            f"**This folder mixes profiles ({', '.join(profiles)}): their numbers do not "
            "compare; each profile belongs in a folder of its own.**",
            "",
        ]
    return out


def _section(s: dict) -> list[str]:
    """A study's section: its profile, seeds, runs and their cost, folder and notebook, then its
    table and figures."""
    name = s["dir"].name
    runs = _summaries_of(s["dir"])
    cost = sum(run_cost_s(r) for r in runs) / 60
    notebooks = "".join(
        f"; executed notebook [`{nb.name}`]({name}/{nb.name})"
        for nb in sorted(s["dir"].glob("*.ipynb"))
    )
    out = [
        "",
        f"## {s['title']}",
        "",
        f"Profile `{s['profile']}`, seeds {s['seeds']}; "
        f"{len(runs)} runs ({cost:.1f} min of run time, runs shared with other studies "
        f"included); folder [`{name}/`]({name}/){notebooks}.",
        "",
    ]
    table = s["dir"] / "table.csv"
    if table.exists():
        out.append(_table_markdown(table))
    for png in sorted(s["dir"].glob("*.png")):
        out += ["", f"![{png.stem}]({name}/{png.name})"]
    return out


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as '-'."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def write(profile_dir: str | os.PathLike) -> Path:
    """``<profile_dir>/REPORT.md`` from that folder's studies."""
    path = Path(profile_dir) / "REPORT.md"
    text = build(profile_dir)
    with rundir.replacing(path) as tmp:
        tmp.write_text(text)
    return path


def write_all(results: str | os.PathLike) -> list[Path]:
    """One REPORT.md per folder to report on: ``results`` itself when it holds studies (a
    profile's folder), else each folder of ``results`` that does (a results root: one folder per
    profile)."""
    root = Path(results)
    dirs = [root] if fs.files(root) else sorted(d for d in root.glob("*/") if fs.files(d))
    if not dirs:
        raise FileNotFoundError(
            f"no */findings.json under {str(results)!r} nor in its profile folders "
            "(*/*/findings.json): run the notebooks first"
        )
    return [write(d) for d in dirs]


# -- profiles side by side ---------------------------------------------------------------------


def claim_key(claim: str) -> str:
    """A claim's text with every number masked: the same claim made at another profile (another
    k, another threshold) has the same key."""
    return re.sub(r"\d+(?:\.\d+)?", "#", claim)


def _matched(found: list[dict | None]) -> list[list[Finding | None]]:
    """One study's findings across the profiles (None: a profile without the study), as rows of
    one finding per profile (None where it lacks the claim): matched by :func:`claim_key` and,
    for claims of one key, by their order; rows in the order of the first profile that has them."""
    rows: dict[tuple[str, int], list[Finding | None]] = {}
    for j, study in enumerate(found):
        seen: dict[str, int] = {}
        for f in study["findings"] if study else []:
            key = claim_key(f.claim)
            seen[key] = seen.get(key, -1) + 1
            rows.setdefault((key, seen[key]), [None] * len(found))[j] = f
    return list(rows.values())


def _agree(findings: list[Finding | None]) -> str:
    """ "same" or "differ" over the verdicts of a claim's tests that decided; "—" with fewer
    than two."""
    decided = [f.outcome for f in findings if f is not None and f.decided]
    if len(decided) < 2:
        return "—"
    return "same" if len(set(decided)) == 1 else "differ"


def _row(title: str, findings: list[Finding | None], verdicts_only: bool = False) -> str:
    """One claim across the profiles: the first profile's claim that has it, the first paper
    given, each profile's verdict and evidence ("—" where it lacks the claim), and agreement;
    ``verdicts_only``: no paper, the verdicts without their evidence."""
    have = [f for f in findings if f is not None]
    paper = next((f.paper for f in have if f.paper), "")
    cells = [
        "—" if f is None else f.answer + ("" if verdicts_only else f": {_cell(f.evidence)}")
        for f in findings
    ]
    lead = f"| {_cell(title)} | {_cell(have[0].claim)} | "
    return (
        lead
        + ("" if verdicts_only else f"{_cell(paper)} | ")
        + " | ".join(cells)
        + f" | {_agree(findings)} |"
    )


def side_by_side(profile_dirs: Sequence[str | os.PathLike], verdicts_only: bool = False) -> str:
    """The markdown of several profiles' findings side by side (``results/cpu results/fashion``):
    one row per claim, matched by study and claim text with its numbers masked (:func:`claim_key`:
    a claim's text can carry a profile's numbers; the row shows the first profile's), in reading
    order, a study's claims in the order of the first profile that has them; the
    paper's numbers (``paper``), then per profile its verdict and evidence, and whether the
    decided verdicts agree. ``verdicts_only``: no paper column and the verdicts alone (README's
    table). Text from the findings.json files only: no number computed."""
    dirs = [Path(d) for d in profile_dirs]
    per = [_profile_studies(d) for d in dirs]  # every folder checked before any output
    out = [
        f"- `{d.name}`: {runs_line(d)}; {fs.counts(_found(studies))}."
        for d, studies in zip(dirs, per, strict=True)
    ]
    paper = "" if verdicts_only else " paper |"
    out += [
        "",
        f"| study | claim |{paper} " + " | ".join(f"`{d.name}`" for d in dirs) + " | agree |",
        "|---|---|" + ("" if verdicts_only else "---|") + "---|" * len(dirs) + "---|",
    ]
    out += [_row(title, row, verdicts_only) for title, row in _rows(per)]
    return "\n".join(out) + "\n"


def _found(studies: dict[str, dict]) -> list[Finding]:
    """Every finding of a profile's studies (:func:`_profile_studies`)."""
    return [f for s in studies.values() for f in s["findings"]]


def headline(profile_dirs: Sequence[str | os.PathLike], link_from: str | os.PathLike = ".") -> str:
    """One row per profile folder: its runs and their run time, its claims and the count of each
    outcome, the decided verdicts that are budget-bound, and a link to its REPORT.md (relative to
    ``link_from``, the folder of the page that shows the table). From the study files only."""
    dirs = [Path(d) for d in profile_dirs]
    per = [_profile_studies(d) for d in dirs]  # every folder checked before any output
    out = [
        f"| profile | runs | claims | {' | '.join(fs.OUTCOMES)} | budget-bound | report |",
        "|---|---|---|" + "---|" * len(fs.OUTCOMES) + "---|---|",
    ]
    for d, studies in zip(dirs, per, strict=True):
        found, records = _found(studies), _summaries(d)
        decided = [f for f in found if f.decided]
        minutes = _trained_minutes(records)
        link = Path(os.path.relpath(d / "REPORT.md", link_from)).as_posix()
        counts = " | ".join(str([f.outcome for f in found].count(o)) for o in fs.OUTCOMES)
        bound = sum(f.budget_bound for f in decided)
        out.append(
            f"| `{d.name}` | {len(records)} ({minutes:.0f} min) | {len(found)} | {counts} | "
            f"{bound} of {len(decided)} | [REPORT.md]({link}) |"
        )
    return "\n".join(out) + "\n"


def _summaries_of(study_dir: Path) -> list[dict]:
    """The summary.json of every run of a study's folder; a damaged run stops the report in
    one line naming it (:func:`lbsgd.lab.experiments.results.run_dirs`), a metrics.jsonl cut
    mid-record is named in a warning."""
    dirs = results.run_dirs(study_dir, needs=("summary.json",))
    results.say_cut(dirs)
    return [json.loads((d / "summary.json").read_text()) for d in dirs]


def _summaries(profile_dir: Path) -> list[dict]:
    """The summary.json of every run of a profile's folder."""
    return [r for d in sorted(Path(profile_dir).glob("*/")) for r in _summaries_of(d)]


def _trained_minutes(records: list[dict]) -> float:
    """The run time of the runs trained here (not copies), over all their attempts, in minutes."""
    return sum(run_cost_s(r) for r in records if not r.get("copied_from")) / 60


def run_cost_s(summary: dict) -> float:
    """A run's wall time over all its attempts (a resumed run's ``total_wall_time_s``; a run
    made before that key: its ``wall_time_s``, its last attempt's); 0 if none is recorded."""
    return float(summary.get("total_wall_time_s") or summary.get("wall_time_s") or 0)


def runs_line(profile_dir: str | os.PathLike) -> str:
    """ "245 runs (208 trained here, 37 copies of another study's), 327 minutes of run time": the
    runs of a profile's folder from their summary.json files; run time is the trained runs' wall
    time added up (several ran at a time, so it is no wall clock of the replay)."""
    records = _summaries(Path(profile_dir))
    trained = sum(not r.get("copied_from") for r in records)
    return (
        f"{len(records)} runs ({trained} trained here, {len(records) - trained} copies "
        f"of another study's), {_trained_minutes(records):.0f} minutes of run time"
    )
