"""The decision rules every study uses (lbsgd.findings.verdict and friends), on hand-made numbers:
replayed, not replayed, and each way of being undecided."""

import math
from pathlib import Path

import pytest

from lbsgd import studies
from lbsgd.config import ConfigError


def test_lower_is_replayed_when_the_margin_exceeds_the_seed_spread():
    # means 4.0 vs 6.0: margin 2.0; spread = max(stdev) = stdev([5.5, 6, 6.5]) = 0.5
    v = studies.lower([3.5, 4.0, 4.5], [5.5, 6.0, 6.5])
    assert v.replayed is True and v.why == ""


def test_lower_is_not_replayed_when_the_other_arm_is_clearly_lower():
    assert studies.lower([5.5, 6.0, 6.5], [3.5, 4.0, 4.5]).replayed is False


def test_a_margin_inside_the_seed_spread_is_undecided_and_says_both_numbers():
    # means 4.0 vs 4.5: margin 0.5; stdev([2, 4, 6]) = 2.0
    v = studies.lower([2.0, 4.0, 6.0], [4.0, 4.5, 5.0])
    assert v.replayed is None
    assert "margin (0.50 points)" in v.why and "seed spread (2.00 points" in v.why


def test_one_seed_per_arm_is_undecided_unless_a_spread_is_given():
    assert studies.lower([3.0], [6.0]).replayed is None
    assert "one seed per arm" in studies.lower([3.0], [6.0]).why
    # the baseline's spread, measured with three seeds elsewhere in the study, decides it
    assert studies.lower([3.0], [6.0], seed_spread=1.0).replayed is True
    assert studies.lower([3.0], [6.0], seed_spread=3.0).replayed is None


def test_every_run_at_chance_is_undecided_whatever_the_order():
    # smoke: errors 86-91% on 10 classes (chance 90%): "constant warmup is the worst" is no evidence
    v = studies.worse_by([91.0], [86.0], 0.0, chance=90.0, seed_spread=0.1)
    assert v.replayed is None and "at chance (90% error)" in v.why
    # one arm learned: decidable
    assert studies.lower([58.0, 57.0], [90.0, 90.2], chance=90.0).replayed is True


def test_within_is_a_threshold_on_the_difference():
    # 4.7 vs 2.7: 2.0 above; within 1.5 is false by 0.5 > spread 0.1
    assert studies.within([4.6, 4.7, 4.8], [2.6, 2.7, 2.8], 1.5).replayed is False
    assert studies.within([3.6, 3.7, 3.8], [2.6, 2.7, 2.8], 1.5).replayed is True
    assert studies.within([4.0, 4.2, 4.4], [2.6, 2.7, 2.8], 1.5).replayed is None  # 1.5 vs 1.5


def test_worse_by_needs_the_gap_beyond_the_threshold():
    assert studies.worse_by([80.0, 79.0], [5.0, 4.0], 5.0).replayed is True
    assert studies.worse_by([8.0, 9.0], [5.0, 4.0], 5.0).replayed is False


def test_a_non_finite_result_is_undecided():
    assert studies.lower([math.nan, 3.0], [5.0, 6.0]).replayed is None


def test_a_verdict_needs_exactly_one_threshold():
    with pytest.raises(ValueError, match="exactly one"):
        studies.verdict([1.0], [2.0])
    with pytest.raises(ValueError, match="exactly one"):
        studies.verdict([1.0], [2.0], more_than=0.0, at_most=1.0)


def test_finding_appends_the_reason_only_when_undecided():
    decided = studies.finding("c", studies.Verdict(True), "4% vs 6%")
    undecided = studies.finding("c", studies.Verdict(None, "why"), "4% vs 6%")
    assert decided.evidence == "4% vs 6%" and decided.replayed is True
    assert undecided.evidence == "4% vs 6%; undecided: why" and undecided.replayed is None


def test_chance_error_of_ten_classes_is_ninety_percent():
    assert studies.chance_error_pct(10) == pytest.approx(90.0)


def test_chance_of_runs_follows_their_dataset_and_is_none_when_unknown():
    import pandas as pd

    assert studies.chance_of(pd.DataFrame({"dataset": ["synthetic"] * 2})) == pytest.approx(90.0)
    assert studies.chance_of(pd.DataFrame({"dataset": ["imagenet"]})) == pytest.approx(99.9)
    fake = pd.DataFrame({"dataset": ["fake"], "fake_classes": [4]})
    assert studies.chance_of(fake) == pytest.approx(75.0)
    assert studies.chance_of(pd.DataFrame({"dataset": ["synthetic", "imagenet"]})) is None
    assert studies.chance_of(pd.DataFrame({"dataset": ["plugin_data"]})) is None
    assert studies.chance_of(pd.DataFrame({"seed": [0]})) is None


def test_results_root_is_the_repository_results_whatever_the_working_directory(
    tmp_path, monkeypatch
):
    repo = Path(studies.__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)  # a kernel started elsewhere (JupyterLab runs it in notebooks/)
    assert studies.results_root(None) == repo / "results"
    assert studies.results_root("results") == repo / "results"
    assert studies.results_root(tmp_path / "r") == tmp_path / "r"


def test_a_session_writes_under_its_profile(tmp_path):
    s = studies.start("warmup", title="2. Warmup", profile="smoke", out_dir=tmp_path)
    assert s.dir == tmp_path / "smoke" / "warmup" and s.out == tmp_path / "smoke"
    assert s.seeds == list(s.profile.seeds)


@pytest.mark.parametrize(
    ("key", "kw"),
    [
        ("study", {"study": "../warmup"}),
        ("profile", {"profile": "huge"}),
        ("seeds", {"seeds": []}),
        ("wandb", {"wandb": "yes"}),
        ("parallel", {"parallel": 0}),
    ],
)
def test_a_session_refuses_bad_parameters_naming_them_before_writing(tmp_path, key, kw):
    args = {"study": "warmup", "title": "t", "out_dir": tmp_path, **kw}
    with pytest.raises(ConfigError, match=key):
        studies.start(args.pop("study"), **args)
    assert list(tmp_path.iterdir()) == []


def test_a_diverged_run_counts_as_full_error_and_the_input_is_untouched():
    import pandas as pd

    df = pd.DataFrame({"status": ["completed", "diverged"], "final_top1_error_pct": [4.0, 12.0]})
    out = studies.diverged_as_failed(df)
    assert list(out["final_top1_error_pct"]) == [4.0, 100.0]
    assert list(out["diverged"]) == [False, True]
    assert list(df["final_top1_error_pct"]) == [4.0, 12.0] and "diverged" not in df


def test_paired_seeds_judge_the_margin_by_the_spread_of_their_differences():
    # every seed 1.0-2.0 points better, though each arm alone spreads 2 points: decided when paired
    a, b = [2.0, 4.0, 6.0], [3.5, 5.0, 8.0]
    assert studies.lower(a, b).replayed is None
    v = studies.lower(a, b, paired=True)  # differences -1.5, -1, -2: mean -1.5, stdev 0.5
    assert v.replayed is True
    # the same means with the seeds shuffled: the differences scatter, undecided
    v = studies.lower(a, [8.0, 3.5, 5.0], paired=True)  # -6, 0.5, 1
    assert v.replayed is None and "of the per-seed differences" in v.why
    with pytest.raises(ValueError, match="one value per seed"):
        studies.lower([1.0, 2.0], [1.0], paired=True)


def test_an_undecided_verdict_names_the_seeds_a_test_of_the_mean_would_need():
    # differences -6, 0.5, 1: margin 1.5, spread sqrt(30.5 / 2) = 3.905; 2·3.905/√n < 1.5 first
    # at n = 28 (√27 gives 1.503, √28 gives 1.476)
    v = studies.lower([2.0, 4.0, 6.0], [8.0, 3.5, 5.0], paired=True)
    assert v.replayed is None and "a two-standard-error test of the mean: 28 seeds" in v.why
    assert studies.seeds_to_decide(1.5, 3.905) == 28 and studies.seeds_to_decide(1.5, 3.91) == 28
    assert studies.seeds_to_decide(1.0, 1.0) == 5  # n > 4: five seeds decide a margin of one spread
    # equal means: no number of seeds separates them
    v = studies.lower([2.0, 4.0, 6.0], [3.0, 3.0, 6.0], paired=True)
    assert v.replayed is None and "test of the mean: no number of seeds" in v.why


# -- which notebooks a profile replays (make reproduce) ------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("[0-9]*_*.ipynb"))


def test_a_profile_replays_its_own_studies_in_notebook_order(capsys):
    from lbsgd import cli
    from lbsgd.studies import scales

    assert scales.notebooks("cpu", NOTEBOOKS) == NOTEBOOKS  # no list: every study
    # no list and no tuning settings: every study but 14, which needs them
    cifar = [Path(p).stem for p in scales.notebooks("cifar10", NOTEBOOKS)]
    assert cifar == [Path(p).stem for p in NOTEBOOKS if "optimizers" not in p]
    fashion = [Path(p).stem for p in scales.notebooks("fashion", NOTEBOOKS)]
    assert fashion == [
        "01_quickstart",
        "02_warmup",
        "03_batch_scaling",
        "04_lr_scaling_rule",
        "05_bn_gamma_init",
        "06_lars",
        "07_bn_decay",
        "08_pool5_bn",
        "11_critical_batch",
        "14_optimizers",
    ]
    # every study a profile names has its notebook (a misspelt study would silently drop one)
    studies_of = {Path(p).stem.split("_", 1)[1] for p in NOTEBOOKS}
    for name, profile in scales.PROFILES.items():
        assert set(profile.studies or ()) <= studies_of, name
    # the command make reproduce calls: the same list on one line; a bad profile in one line
    assert cli.main(["notebooks", "fashion", *NOTEBOOKS]) == 0
    assert capsys.readouterr().out.split() == scales.notebooks("fashion", NOTEBOOKS)
    assert cli.main(["notebooks", "fashon", *NOTEBOOKS]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("lbsgd: error: profile='fashon' is not one of") and "fashion" in err
    assert len(err.splitlines()) == 1
