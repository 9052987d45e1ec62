"""The committed replays (results/cpu/, results/fashion/) are what their runs produced: every run
finished under the profile's instruction-set cap, its folder is the name its config gives, and the
report is the one `lbsgd report` builds from the study files (no number edited by hand)."""

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lbsgd import config, rundir
from lbsgd.lab import report, verify
from lbsgd.lab.studies import scales
from lbsgd.lab.studies import steps_to_target as stt

RESULTS = Path(__file__).resolve().parents[1] / "results"
CPU = RESULTS / "cpu"
RUNS = sorted(p.parent for p in CPU.glob("*/*/summary.json"))
# the committed replays, all made under cpu_isa=portable
PROFILES = ("cpu", "fashion", "fashion-long")


def _runs(profile: str) -> list[Path]:
    runs = sorted(p.parent for p in (RESULTS / profile).glob("*/*/summary.json"))
    if not runs:
        pytest.skip(f"no committed results/{profile}/ in this checkout")
    return runs


@pytest.mark.parametrize("profile", PROFILES)
def test_every_committed_run_finished_under_the_portable_cap_in_its_own_folder(profile):
    for run in _runs(profile):
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] in ("completed", "diverged"), run
        keys = yaml.safe_load((run / "config.yaml").read_text())
        cfg = config.from_dict({k: v for k, v in keys.items() if k in config.KEYS})
        assert (cfg.profile, cfg.study, cfg.cpu_isa) == (profile, run.parent.name, "portable"), run
        assert cfg.run_name() == run.name and summary["experiment_id"] == cfg.experiment_id()
        caps = summary["environment"]["cpu_isa"]
        assert caps["in_effect"] and caps["pinned_before_torch"] and caps["aten"] == "AVX2", run
        # portable: MKL's conditional-numerical-reproducibility branch common to every vendor,
        # and no oneDNN convolutions (lbsgd.isa)
        assert caps["mkl_cbwr"] == "COMPATIBLE" and caps["onednn_convolutions"] is False, run


@pytest.mark.parametrize("profile", PROFILES)
def test_the_committed_report_is_the_one_built_from_the_study_files(profile):
    _runs(profile)
    assert (RESULTS / profile / "REPORT.md").read_text() == report.build(RESULTS / profile)


def test_measuring_the_noise_scale_changed_no_committed_result():
    """Study 11 re-ran notebook 3's sweep with noise_scale=true (a run key): every run of the same
    name ended with the same losses and errors, to the last digit, and measured where it could."""
    _runs("cpu")
    pairs = [
        (run, CPU / "batch_scaling" / run.name)
        for run in RUNS
        if run.parent.name == "critical_batch"
    ]
    assert len(pairs) == 19
    for run, twin in pairs:
        ours, theirs = (json.loads((d / "summary.json").read_text()) for d in (run, twin))
        assert ours["final"] == theirs["final"] and ours["steps"] == theirs["steps"], run.name
        measured = "noise_scale" in ours
        assert measured == (ours["total_steps"] < 5000), run.name  # all but batch 16 = B_small


def test_the_fashion_replay_measured_the_noise_scale_in_notebook_3s_own_runs():
    """fashion (batch_scaling.NOISE_SCALE): study 11's runs are copies of notebook 3's, which measured
    the noise scale above B_small (16) while they trained."""
    runs = [r for r in _runs("fashion") if r.parent.name == "critical_batch"]
    assert len(runs) == 28  # k = 1 to 16, five seeds each; 32, 64, 128 one seed
    for run in runs:
        ours = json.loads((run / "summary.json").read_text())
        twin = RESULTS / "fashion" / "batch_scaling" / run.name
        assert ours["copied_from"] == f"batch_scaling/{run.name}", run.name
        assert ours["final"] == json.loads((twin / "summary.json").read_text())["final"]
        keys = yaml.safe_load((twin / "config.yaml").read_text())
        assert keys["noise_scale"] == (keys["batch_size"] > 16) == ("noise_scale" in ours), run.name


SIDE_BY_SIDE = "<!-- lbsgd report --side-by-side results/cpu results/fashion --verdicts -->"
HEADLINE = "<!-- lbsgd report --headline results/cpu results/fashion results/fashion-long -->"


def _block(text: str, marker: str) -> str:
    assert marker in text, f"no marker line {marker!r}"
    return text.split(marker + "\n", 1)[1].split("<!-- end -->", 1)[0]


def test_the_docs_table_of_verdicts_is_the_one_the_report_command_prints():
    _runs("cpu"), _runs("fashion")
    page = (RESULTS.parent / "docs" / "results.md").read_text()
    want = report.side_by_side([RESULTS / "cpu", RESULTS / "fashion"], verdicts_only=True)
    assert _block(page, SIDE_BY_SIDE) == want


def test_readmes_headline_table_is_the_one_the_report_command_prints():
    _runs("cpu"), _runs("fashion"), _runs("fashion-long")
    readme = (RESULTS.parent / "README.md").read_text()
    assert _block(readme, HEADLINE) == report.headline(
        [Path("results/cpu"), Path("results/fashion"), Path("results/fashion-long")]
    )
    # its links are the reports themselves
    assert "[REPORT.md](results/cpu/REPORT.md)" in _block(readme, HEADLINE)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_committed_run_names_the_clean_commit_that_made_it(profile):
    """A committed result comes from a clean commit: its git_commit is a full hash without
    ``-dirty`` (a copy carries its twin's)."""
    for run in _runs(profile):
        commit = json.loads((run / "summary.json").read_text())["environment"]["git_commit"]
        assert re.fullmatch(r"[0-9a-f]{40}", commit or ""), f"{run}: git_commit {commit!r}"


def test_no_committed_run_anywhere_under_results_records_a_dirty_tree():
    """Beyond the profiles' folders too (a GPU check's runs, a benchmark's): every summary.json
    under results/ names a clean commit, as a result must."""
    summaries = sorted(RESULTS.rglob("summary.json"))
    if not summaries:
        pytest.skip("no committed results/ in this checkout")
    dirty = [
        str(p.parent.relative_to(RESULTS))
        for p in summaries
        if str(json.loads(p.read_text())["environment"].get("git_commit")).endswith("-dirty")
    ]
    assert not dirty, f"runs made from a dirty tree: {dirty}"


def test_every_committed_summary_has_the_declared_shape():
    """Every summary.json under results/ (both loops', the copies', a GPU check's) read back
    against rundir.Summary: no field undeclared, none of another type."""
    summaries = sorted(RESULTS.rglob("summary.json"))
    if not summaries:
        pytest.skip("no committed results/ in this checkout")
    problems = []
    for p in summaries:
        try:
            rundir.check_summary(json.loads(p.read_text()))
        except ValueError as e:
            problems.append(f"{p.parent.relative_to(RESULTS)}: {e}")
    assert not problems, problems[:5]


# cpu: .ci/run's main job (make reproduce over the committed results, git status empty after)
@pytest.mark.slow
@pytest.mark.parametrize("profile", [p for p in PROFILES if p != "cpu"])
def test_every_committed_finding_is_what_the_code_computes_from_the_committed_runs(
    profile, tmp_path
):
    """Every notebook the profile replays, executed (papermill, W&B off, with the parameters its
    committed executed copy records) over a copy of the committed runs, where every run is
    complete so nothing trains, writes the committed findings.json and table.csv, and the report
    built from them is the committed REPORT.md."""
    _runs(profile)
    root = tmp_path / "results"
    shutil.copytree(RESULTS / profile, root / profile, ignore=verify.RECORDS_ONLY)
    if (RESULTS / "benchmarks").is_dir():  # what notebooks 10 and 12 read beside the runs
        shutil.copytree(RESULTS / "benchmarks", root / "benchmarks")
    for other in scales.get(profile).beside:  # what its report sets beside its own findings
        if (RESULTS / other).is_dir():
            shutil.copytree(RESULTS / other, root / other, ignore=verify.RECORDS_ONLY)
    for study in root.glob(f"{profile}/*/"):
        for name in ("findings.json", "table.csv", "ladder.csv"):
            (study / name).unlink(missing_ok=True)
    notebooks = sorted(str(p) for p in (RESULTS.parent / "notebooks").glob("[0-9]*_*.ipynb"))
    for nb in scales.notebooks(profile, notebooks):
        study = Path(nb).stem.split("_", 1)[1]
        executed = json.loads((RESULTS / profile / study / Path(nb).name).read_text())
        given = executed["metadata"]["papermill"]["parameters"]
        own = {"profile": profile, "out_dir": str(root), "wandb": "disabled", "parallel": 1}
        cmd = [
            *(sys.executable, "-m", "papermill", "--no-progress-bar", nb),
            str(root / profile / study / Path(nb).name),
            *("-y", yaml.safe_dump({**given, **own})),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{nb}: {done.stderr[-2000:]}"
        for name in ("findings.json", "table.csv", "ladder.csv"):
            committed = RESULTS / profile / study / name
            if committed.exists():
                assert (root / profile / study / name).read_text() == committed.read_text(), (
                    f"{profile}/{study}/{name} is not what the code computes"
                )
    assert report.build(root / profile) == (RESULTS / profile / "REPORT.md").read_text()


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profiles_s_min_is_its_committed_critical_batch_fit(profile):
    """The budget-bound mark reads Profile.s_min, study 14's words Profile.b_crit: study 11's
    fitted S_min and B_crit at that profile (study 15's, on a held-out error target, where the
    profile replays it instead); none without a fit."""
    _runs(profile)
    critical = RESULTS / profile / "critical_batch" / "fit.csv"
    ladder = RESULTS / profile / "steps_to_target" / "table.csv"
    p = scales.get(profile)
    if critical.exists():
        with critical.open() as f:
            (fit,) = list(csv.DictReader(f))
        assert p.s_min == round(float(fit["s_min"]), 1)
        assert p.b_crit == round(float(fit["b_crit"]), 1)
        assert p.s_min_target == f"study 11's training loss {float(fit['target_loss']):.3g}"
    elif ladder.exists():
        with ladder.open() as f:
            rows = list(csv.DictReader(f))
        assert p.s_min == round(float(rows[0]["s_min"]), 1)
        assert p.b_crit == round(float(rows[0]["b_crit"]), 1)
        assert p.s_min_target == f"study 15's held-out top-1 error {stt.settings(p)['target']:g}%"
    else:
        assert scales.get(profile).s_min is None and scales.get(profile).b_crit is None


# a folder of the machine that executed a notebook: an absolute path under a usual root
MACHINE_FOLDER = re.compile(r"(?<![\w.~/-])/(?:tmp|work|home|root|Users|check|mnt|scratch)/[\w.-]")


def test_no_committed_notebook_names_a_folder_of_the_machine_that_executed_it():
    """The executed notebooks under results/ name files relative to the repository, so that
    ``make reproduce`` in any clone leaves them as committed (their cells' outputs, parameters
    and metadata read as text)."""
    named = {
        str(nb.relative_to(RESULTS)): MACHINE_FOLDER.findall(nb.read_text())
        for nb in sorted(RESULTS.rglob("*.ipynb"))
    }
    assert len(named) > 20  # every profile's notebooks are read
    assert not {nb: found for nb, found in named.items() if found}


CI = re.compile(r"95% CI \[x?([-+]?\d+\.?\d*), x?([-+]?\d+\.?\d*)\]")


def _same_interval(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Two printed intervals of one statistic: equal, or one the other's reciprocal (a ratio
    read upside down), to the printed digits."""

    def close(x: float, y: float) -> bool:
        return abs(x - y) <= 0.011 * max(abs(x), abs(y), 0.01)

    if close(a[0], b[0]) and close(a[1], b[1]):
        return True
    return min(*a, *b) > 0 and close(a[0], 1 / b[1]) and close(a[1], 1 / b[0])


@pytest.mark.parametrize("profile", PROFILES)
def test_no_two_claims_of_a_report_read_the_same_ratio(profile):
    """One statistic, one claim: no two tested claims of a profile print the same interval of a
    ratio (or its reciprocal), as study 16's "B_crit within x3 of the fit" printed study 15's x2 ratio
    upside down (0.44 [0.41, 0.48] against 2.25 [2.07, 2.43]) and counted twice in the BH family."""
    _runs(profile)
    tested = []
    for path in sorted((RESULTS / profile).glob("*/findings.json")):
        for f in json.loads(path.read_text())["findings"]:
            if f["outcome"] in ("measured", "invalid") or f.get("p_for") is None:
                continue
            for m in CI.finditer(f["evidence"]):
                lo, hi = float(m[1]), float(m[2])
                ratio = "[x" in m[0] or "ratio" in f["evidence"][max(0, m.start() - 80) : m.start()]
                if ratio and lo != hi:  # a point (every seed alike) reads no spread
                    tested.append((f"{path.parent.name}: {f['claim']}", (lo, hi)))
    twice = [
        (a, b)
        for i, (a, x) in enumerate(tested)
        for b, y in tested[i + 1 :]
        if a != b and _same_interval(x, y)
    ]
    assert not twice, twice[:3]


def test_study_17s_later_rung_keeps_the_earlier_rungs_choice_of_points():
    """Rung r's points are chosen on the seeds of the rungs before it alone: the trials rung 2
    would add to rung 1's are those rung 1 ran, not a re-ranking by rung 1's own seed."""
    from lbsgd.lab.experiments import results
    from lbsgd.lab.studies import optimizers_at_scale as big

    _runs("fashion-long")
    study, p = RESULTS / "fashion-long" / big.STUDY, scales.get("fashion-long")

    def names(runs):
        return [config.from_dict(r).run_name() for r in runs]

    c = big.centres(results.load_runs(study, names(big.range_tests(p))))
    rung1 = names(big.halving(p, c, results.load_runs(study, names(big.halving(p, c, None, 0))), 1))
    both = results.load_runs(study, rung1)
    assert len(both) == len(rung1)  # every trial of rungs 0 and 1 committed
    assert set(rung1) <= set(names(big.halving(p, c, both, 2)))


@pytest.mark.parametrize("profile", ["fashion", "fashion-long"])
def test_study_16s_reference_is_the_one_its_study_computes_from_its_runs(profile):
    """Study 16 reads study 15's (or 11's) results through the files that study wrote, every
    digit: the same steps, seeds, fit and target as that study's code computes from its runs."""
    import numpy as np

    from lbsgd.lab import experiments as ex
    from lbsgd.lab.studies import critical_batch as cb
    from lbsgd.lab.studies import plan_check as pc

    _runs(profile)
    p = scales.get(profile)
    ref = pc.reference(RESULTS / profile, p)
    if ref.source == pc.LADDER:
        seeds, goal = list(stt.settings(p)["seeds"]), stt.target_of(p)
        runs = ex.load_runs(RESULTS / profile / stt.STUDY)
        m = stt.measure(runs[runs["seed"].isin(seeds)], goal, stt.base_lr(p))
        s = stt.seed_steps(m, stt.choose(m, seeds[0]), seeds[0])
        assert ref.per_seed.seeds == s.seeds and (ref.target.kind, ref.target.value) == (
            "error",
            goal,
        )
        for a, b in ((ref.per_seed.batches, s.batches), (ref.per_seed.steps, s.steps)):
            assert np.array_equal(a, b, equal_nan=True)
        fit = s.fit()
    else:
        m = cb.measure(ex.load_runs(RESULTS / profile / cb.STUDY), p.large_k)
        fit = cb.fit_runs(m)
        assert ref.target.value == float(m["target_loss"].iloc[0]) and ref.probe_k == cb.baseline_k(
            m
        )
        mine = {(int(r.batch_size), int(r.seed)): float(r.steps_to_target) for r in m.itertuples()}
        assert mine.keys() == ref.steps.keys()
        assert all(
            np.isnan(v) and np.isnan(ref.steps[k]) or v == ref.steps[k] for k, v in mine.items()
        )
    assert ref.fit == fit
