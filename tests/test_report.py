"""Findings carry the paper's numbers (``paper``), and ``lbsgd report --side-by-side`` sets
several profiles' findings beside each other, claim by claim, from their findings.json alone."""

import json
from pathlib import Path

from lbsgd import cli
from lbsgd.lab import experiments as ex
from lbsgd.lab import findings as fs
from lbsgd.lab import report
from lbsgd.lab.findings import Finding

GRADUAL = "Goyal Table 1: gradual 23.74% vs none 24.84% error (8k)"
CONSTANT = "Goyal Table 1: constant 25.88%, none 24.84%, gradual 23.74% error (8k)"
# a test's p's that decide a claim either way, and what the report's false-discovery control adds
# to the evidence of two such claims
FOR, AGAINST = {"p_for": 0.001, "p_against": 1.0}, {"p_for": 1.0, "p_against": 0.001}
Q = "; BH q = 0.001 over 2 tested claims"


def write_study(profile_dir: Path, study: str, title: str, findings: list[dict]) -> None:
    """A findings.json as a notebook writes it (the findings' dicts exactly as given: one without
    ``paper`` is a file written before the field existed)."""
    d = profile_dir / study
    d.mkdir(parents=True)
    record = {
        "study": study,
        "title": title,
        "profile": profile_dir.name,
        "seeds": [0, 1, 2],
        "findings": findings,
    }
    (d / "findings.json").write_text(json.dumps(record, indent=2) + "\n")


def two_profiles(root: Path) -> tuple[Path, Path]:
    """cpu: quickstart and scaling in the old format (no ``paper``), quickstart's claim measured
    (no test), warmup with two tested claims; fashion: no quickstart, warmup with a third claim
    listed first and another k in a claim's text, scaling with ``paper``."""
    cpu, fashion = root / "cpu", root / "fashion"
    write_study(
        cpu,
        "quickstart",
        "1. Quickstart",
        [{"claim": "a run learns", "replayed": True, "evidence": "top-1 error 4.6% vs chance 90%"}],
    )
    write_study(
        cpu,
        "warmup",
        "2. Warmup (Goyal Table 1)",
        [
            {
                "claim": "gradual beats none at k=16",
                "replayed": True,
                "evidence": "3.1% vs 6.1% | mean of 3",
                **FOR,
                "paper": GRADUAL,
            },
            {
                "claim": "constant is the worst",
                "replayed": False,
                "evidence": "constant 5.0%",
                **AGAINST,
                "paper": CONSTANT,
            },
        ],
    )
    write_study(
        cpu,
        "scaling",
        "10. Scaling",
        [{"claim": "the model predicts the step", "replayed": None, "evidence": "no measurement"}],
    )
    write_study(
        fashion,
        "scaling",
        "10. Scaling",
        [
            {
                "claim": "the model predicts the step",
                "replayed": None,
                "evidence": "one process",
                "paper": "no published number",
            }
        ],
    )
    write_study(
        fashion,
        "warmup",
        "2. Warmup (Goyal Table 1)",
        [
            {
                "claim": "the curves match",
                "replayed": None,
                "evidence": "gap +3.0%; undecided: one seed per arm",
                "paper": "Goyal Fig. 2c: qualitative",
            },
            {
                "claim": "gradual beats none at k=32",
                "replayed": True,
                "evidence": "10.2% vs 12.9%",
                **FOR,
                "paper": GRADUAL,
            },
            {
                "claim": "constant is the worst",
                "replayed": True,
                "evidence": "constant 14.0%",
                **FOR,
                "paper": CONSTANT,
            },
        ],
    )
    return cpu, fashion


def test_side_by_side_matches_claims_by_study_and_their_text_with_numbers_masked(tmp_path):
    cpu, fashion = two_profiles(tmp_path)
    assert report.side_by_side([cpu, fashion]) == (
        "- `cpu`: 0 runs (0 trained here, 0 copies of another study's), 0 minutes of run time; "
        "4 claims: 1 replayed, 1 not replayed, 1 undecided, 0 invalid, 1 measured (one number "
        "beside its threshold, no test); 0 of the 2 decided are budget-bound (an arm under S_min).\n"
        "- `fashion`: 0 runs (0 trained here, 0 copies of another study's), 0 minutes of run time; "
        "4 claims: 2 replayed, 0 not replayed, 2 undecided, 0 invalid, 0 measured (one number "
        "beside its threshold, no test); 0 of the 2 decided are budget-bound (an arm under S_min).\n"
        "\n"
        "| study | claim | paper | `cpu` | `fashion` | agree |\n"
        "|---|---|---|---|---|---|\n"
        "| 1. Quickstart | a run learns |  | measured: top-1 error 4.6% vs chance 90% | — | — |\n"
        f"| 2. Warmup (Goyal Table 1) | gradual beats none at k=16 | {GRADUAL} | "
        f"yes: 3.1% vs 6.1% \\| mean of 3{Q} | yes: 10.2% vs 12.9%{Q} | same |\n"
        f"| 2. Warmup (Goyal Table 1) | constant is the worst | {CONSTANT} | "
        f"**no**: constant 5.0%{Q} | yes: constant 14.0%{Q} | differ |\n"
        "| 2. Warmup (Goyal Table 1) | the curves match | Goyal Fig. 2c: qualitative | — | "
        "undecided: gap +3.0%; undecided: one seed per arm | — |\n"
        "| 10. Scaling | the model predicts the step | no published number | "
        "undecided: no measurement | undecided: one process | — |\n"
    )
    # the other order: fashion's claim texts, fashion's columns first
    rows = report.side_by_side([fashion, cpu]).splitlines()
    assert rows[:2] == [
        "- `fashion`: 0 runs (0 trained here, 0 copies of another study's), 0 minutes of run time; "
        "4 claims: 2 replayed, 0 not replayed, 2 undecided, 0 invalid, 0 measured (one number "
        "beside its threshold, no test); 0 of the 2 decided are budget-bound (an arm under S_min).",
        "- `cpu`: 0 runs (0 trained here, 0 copies of another study's), 0 minutes of run time; "
        "4 claims: 1 replayed, 1 not replayed, 1 undecided, 0 invalid, 1 measured (one number "
        "beside its threshold, no test); 0 of the 2 decided are budget-bound (an arm under S_min).",
    ]
    # fashion's order within a study: the curves first, then the claims cpu also makes
    assert rows[5].startswith("| 1. Quickstart | a run learns |  | — | measured: ")
    assert rows[6].startswith("| 2. Warmup (Goyal Table 1) | the curves match |")
    assert rows[7].startswith("| 2. Warmup (Goyal Table 1) | gradual beats none at k=32 |")
    assert rows[7].endswith(
        f"| yes: 10.2% vs 12.9%{Q} | yes: 3.1% vs 6.1% \\| mean of 3{Q} | same |"
    )


def test_side_by_side_verdicts_only_drops_the_paper_and_the_evidence(tmp_path, capsys):
    cpu, fashion = two_profiles(tmp_path)
    rows = report.side_by_side([cpu, fashion], verdicts_only=True).splitlines()
    assert rows[3:8] == [
        "| study | claim | `cpu` | `fashion` | agree |",
        "|---|---|---|---|---|",
        "| 1. Quickstart | a run learns | measured | — | — |",
        "| 2. Warmup (Goyal Table 1) | gradual beats none at k=16 | yes | yes | same |",
        "| 2. Warmup (Goyal Table 1) | constant is the worst | **no** | yes | differ |",
    ]
    assert rows[-1] == "| 10. Scaling | the model predicts the step | undecided | undecided | — |"
    assert cli.main(["report", "--side-by-side", str(cpu), str(fashion), "--verdicts"]) == 0
    assert capsys.readouterr().out == "\n".join(rows) + "\n"


def test_claim_key_masks_the_numbers_of_a_claim_and_keeps_its_words():
    assert report.claim_key("gradual beats none at k=16 (within 1.5 points)") == (
        "gradual beats none at k=# (within # points)"
    )
    assert report.claim_key("fp16 reaches fp32") != report.claim_key("bf16 reaches fp32")


def test_the_cli_prints_the_side_by_side_table_and_writes_nothing(tmp_path, capsys):
    cpu, fashion = two_profiles(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert cli.main(["report", "--side-by-side", str(cpu), str(fashion)]) == 0
    assert capsys.readouterr().out == report.side_by_side([cpu, fashion])
    assert sorted(tmp_path.rglob("*")) == before  # no REPORT.md


def test_side_by_side_of_a_folder_without_findings_is_one_line_naming_it(tmp_path, capsys):
    cpu, _ = two_profiles(tmp_path)
    empty = tmp_path / "fashion-not-run"
    empty.mkdir()
    assert cli.main(["report", "--side-by-side", str(cpu), str(empty)]) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1
    assert lines[0].startswith("lbsgd: error: no */findings.json under") and str(empty) in lines[0]


def test_findings_json_round_trips_paper_and_reads_an_old_file_as_empty(tmp_path):
    findings = [
        Finding("gradual beats none", True, "3.1% vs 6.1%", paper=GRADUAL),
        Finding("constant is the worst", None, "one seed"),
    ]
    study_dir = ex.study_dir(tmp_path, "warmup")
    path = fs.write(study_dir, "warmup", "cpu", [0], findings, title="2. Warmup")
    written = json.loads(path.read_text())["findings"]
    assert written[0]["paper"] == GRADUAL and written[1]["paper"] == ""
    assert [Finding.from_dict(f) for f in written] == findings
    old = {"claim": "a run learns", "replayed": False, "evidence": "diverged"}
    assert Finding.from_dict(old) == Finding("a run learns", False, "diverged", paper="")


def test_report_build_shows_no_paper_field_so_old_and_new_files_build_alike(tmp_path):
    cpu, _ = two_profiles(tmp_path)
    with_paper = report.build(cpu)
    path = cpu / "warmup" / "findings.json"
    record = json.loads(path.read_text())
    for f in record["findings"]:
        del f["paper"]
    path.write_text(json.dumps(record))
    assert report.build(cpu) == with_paper and GRADUAL not in with_paper


def test_each_display_of_an_outcome_is_one_of_the_findings_modules_words():
    # REPORT.md's column, the counts, W&B's table and the line a notebook prints: one set of words
    assert fs.OUTCOMES == ("replayed", "not replayed", "undecided", "invalid", "measured")
    answers = ["yes", "**no**", "undecided", "invalid", "measured"]
    assert [fs.answer(o) for o in fs.OUTCOMES] == answers
    louds = ["replayed", "NOT replayed", "undecided", "INVALID", "measured"]
    assert [fs.loud(o) for o in fs.OUTCOMES] == louds
    # budget-bound marks the verdict of a test only: a measured claim has none to bound
    bound = [fs.answer(o, budget_bound=True) for o in fs.OUTCOMES]
    assert bound == ["yes, budget-bound", "**no**, budget-bound", *answers[2:]]


def test_the_report_shows_verdicts_after_false_discovery_control_invalid_and_budget_bound_apart(
    tmp_path,
):
    """findings.json keeps each claim's own verdict at 5%; REPORT.md controls the false-discovery
    rate over the folder's tested claims (BH), counts invalid claims apart, and marks a decided
    verdict from an arm under S_min as budget-bound."""
    cpu = tmp_path / "cpu"
    bound = fs.Budget({"k=1": 3750, "k=128": 30}, 55.1, "Goyal's 32k run: 3,519")
    claims = [
        fs.Finding("a strong effect", True, "e1", p_for=0.001, p_against=1.0),
        fs.Finding("a weak effect", True, "e2", p_for=0.04, p_against=1.0),  # q = 0.04·4/3
        fs.Finding("no effect", None, "e6; undecided: across", p_for=0.5, p_against=1.0),
        fs.Finding("an arm at chance", None, "e3; invalid: an arm did not train", invalid=True),
        fs.Finding("a few steps", True, "e4", p_for=0.002, p_against=1.0, budget=bound),
        fs.Finding("a cost model", False, "e5"),  # no test: not in the family
    ]
    write_study(cpu, "warmup", "2. Warmup", [f.to_dict() for f in claims])
    text = report.build(cpu)
    assert "6 claims: 3 replayed" not in text  # the count before the control
    assert (
        "6 claims: 2 replayed, 0 not replayed, 2 undecided, 1 invalid, 1 measured (one number "
        "beside its threshold, no test); 1 of the 2 decided are budget-bound (an arm under S_min)."
    ) in text
    row = {line.split(" | ")[2]: line for line in text.splitlines() if line.startswith("| [2.")}
    assert (
        "| undecided | e2; undecided after false-discovery control: BH q = 0.0533"
        in row["a weak effect"]
    )
    assert "| yes | e1; BH q = 0.004 over 4 tested claims |" in row["a strong effect"]
    assert "| invalid | e3; invalid: an arm did not train |" in row["an arm at chance"]
    assert "| yes, budget-bound | e4; BH q = 0.004" in row["a few steps"]
    assert "| measured | e5 |" in row["a cost model"]


def test_a_claim_decided_from_a_number_without_a_test_reads_measured_and_is_counted_apart(
    tmp_path,
):
    """A valid claim with no test (no p's) decided from a number beside its threshold is
    *measured*: findings.json keeps which side the number fell (``replayed``) but says measured,
    REPORT.md's answer reads `measured` (no yes/no, no bold) beside the number and threshold of
    its evidence, the headline and README's table count it apart, budget-bound counts only the
    verdicts of a test, and the false-discovery control leaves it out of its family. An
    untested claim with no data stays undecided."""
    cpu = tmp_path / "cpu"
    under = fs.Budget({"k=128": 30}, 55.1, "")  # under S_min: a test's verdict would be bound
    claims = [
        fs.Finding("the model predicts the step", False, "ratio 0.67 (the claim: 0.75 to 1.25)"),
        fs.Finding("B_noise at the knee", True, "B_noise 352; ×2 band [64, 512]", budget=under),
        fs.Finding("a strong effect", True, "e1", p_for=0.001, p_against=1.0),
        fs.Finding("a weak effect", True, "e2", p_for=0.03, p_against=1.0),
        fs.Finding("no data", None, "e3; undecided: no run"),
    ]
    write_study(cpu, "scaling", "10. Scaling", [f.to_dict() for f in claims])
    written = json.loads((cpu / "scaling" / "findings.json").read_text())["findings"]
    assert [(f["replayed"], f["outcome"]) for f in written] == [
        (False, "measured"),
        (True, "measured"),
        (True, "replayed"),
        (True, "replayed"),
        (None, "undecided"),
    ]
    text = report.build(cpu)
    row = {line.split(" | ")[2]: line for line in text.splitlines() if line.startswith("| [10.")}
    assert row["the model predicts the step"].endswith(
        "| measured | ratio 0.67 (the claim: 0.75 to 1.25) |"
    )
    # no q (outside the family) and no budget-bound mark
    assert row["B_noise at the knee"].endswith("| measured | B_noise 352; ×2 band [64, 512] |")
    # BH over the two tested claims only: 0.03 · 2/2 (over four it would be 0.06, undecided)
    assert "| yes | e2; BH q = 0.03 over 2 tested claims |" in row["a weak effect"]
    assert "| undecided | e3; undecided: no run |" in row["no data"]
    assert (
        "5 claims: 2 replayed, 0 not replayed, 1 undecided, 0 invalid, 2 measured (one number "
        "beside its threshold, no test); 0 of the 2 decided are budget-bound (an arm under S_min)."
    ) in text
    head = report.headline([cpu]).splitlines()
    assert head[0] == (
        "| profile | runs | claims | replayed | not replayed | undecided | invalid | measured | "
        "budget-bound | report |"
    )
    assert head[2].startswith("| `cpu` | 0 (0 min) | 5 | 2 | 0 | 1 | 0 | 2 | 0 of 2 |")


def test_a_profiles_runs_line_counts_copies_apart_and_adds_up_the_trained_runs_wall_time(tmp_path):
    for study, run, record in [
        ("warmup", "a", {"wall_time_s": 90.0}),
        ("warmup", "b", {"wall_time_s": 150.0}),
        ("lars", "a", {"wall_time_s": 90.0, "copied_from": "warmup/a"}),
    ]:
        (tmp_path / study / run).mkdir(parents=True)
        (tmp_path / study / run / "summary.json").write_text(json.dumps(record))
    assert report.runs_line(tmp_path) == (
        "3 runs (2 trained here, 1 copies of another study's), 4 minutes of run time"
    )


def test_a_profiles_report_sets_its_beside_profiles_verdicts_and_differing_budgets_beside_it(
    tmp_path,
):
    cpu, fashion = two_profiles(tmp_path)
    long = tmp_path / "fashion-long"  # beside=("fashion", "cpu")
    budget = fs.Budget({"k=1": 30_000, "k=16": 1_875}, 61.1, "Goyal's 4k run: 28,152")
    write_study(
        long,
        "warmup",
        "2. Warmup (Goyal Table 1)",
        [
            {
                "claim": "gradual beats none at k=16",
                "replayed": False,
                "evidence": "12.9% vs 12.1%",
                **AGAINST,
                "budget": budget.to_dict(),
            }
        ],
    )
    text = report.build(long)
    section = text.split("## Beside `fashion`, `cpu`\n", 1)[1]
    assert report.side_by_side([long, fashion, cpu], verdicts_only=True) in section
    # the claim decided three ways: each profile's verdict and budget (cpu's and fashion's files
    # carry none)
    line = next(x for x in section.splitlines() if x.startswith("- gradual beats none"))
    assert "`fashion-long` **no** (optimizer steps: k=1 30,000, k=16 1,875; S_min 61" in line
    assert "`fashion` yes (no budget)" in line and "`cpu` yes (no budget)" in line
    # a profile without beside profiles (or without their folders) has no such section
    assert "## Beside" not in report.build(cpu)
    (tmp_path / "elsewhere").mkdir()
    moved = tmp_path / "elsewhere" / "fashion-long"
    long.rename(moved)
    assert "## Beside" not in report.build(moved)


def test_the_headline_counts_each_profiles_outcomes_and_links_its_report(tmp_path):
    cpu, fashion = two_profiles(tmp_path)
    text = report.headline([cpu, fashion], link_from=tmp_path)
    rows = text.splitlines()
    assert rows[0].startswith("| profile | runs | claims | replayed | not replayed | undecided |")
    # cpu: a run learns (measured), gradual beats none (yes), constant worst (no), model
    # (undecided)
    assert rows[2] == (
        "| `cpu` | 0 (0 min) | 4 | 1 | 1 | 1 | 0 | 1 | 0 of 2 | [REPORT.md](cpu/REPORT.md) |"
    )
    assert rows[3].startswith("| `fashion` | 0 (0 min) | 4 | 2 | 0 | 2 | 0 | 0 |")
    assert rows[3].endswith("[REPORT.md](fashion/REPORT.md) |")
