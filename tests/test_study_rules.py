"""The decision rules every study uses (lbsgd.lab.findings.verdict and friends), on hand-made numbers:
replayed, not replayed, and each way of being undecided."""

import math
from pathlib import Path

import pytest

from lbsgd.lab import studies


def test_lower_is_replayed_when_the_whole_interval_lies_on_its_side():
    # Welch: means 2.0 apart, each arm sd 0.5 (se 0.41, 4 df, t 2.78): the interval [0.87, 3.13]
    v = studies.lower([3.5, 4.0, 4.5], [5.5, 6.0, 6.5])
    assert v.replayed is True and v.why == ""
    assert "95% CI [+0.87, +3.13]" in v.test and "Welch t" in v.test


def test_lower_is_not_replayed_when_the_interval_lies_wholly_on_the_other_side():
    assert studies.lower([5.5, 6.0, 6.5], [3.5, 4.0, 4.5]).replayed is False


def test_an_interval_across_the_threshold_is_undecided_and_says_the_seeds_for_80_percent_power():
    # means 4.5 vs 4.0, arm sd 2.0: the interval reaches far across 0
    v = studies.lower([2.0, 4.0, 6.0], [4.0, 4.5, 5.0])
    assert v.replayed is None and v.p_against == 1.0 and v.p_for > 0.05
    assert "reaches across the threshold +0" in v.why
    n = studies.seeds_to_decide(0.5, 2.0, paired=False)
    assert f"80% power would take {n} seeds per arm" in v.why


def test_one_run_per_arm_is_undecided():
    v = studies.lower([3.0], [6.0])
    assert v.replayed is None and "one run per arm" in v.why and v.p is None


def test_an_arm_at_chance_makes_the_comparison_invalid_whatever_the_other_arm_did():
    # pool5-BN 43% against a plain AlexNet at chance (90%): no evidence about pool5-BN
    v = studies.lower([43.0, 44.0, 42.5], [90.0, 90.08, 89.0], chance=90.0)
    assert v.invalid and v.replayed is None and "did not train" in v.why
    # an arm whose mean is 6 points from chance trained
    assert not studies.lower([43.0, 44.0, 42.5], [84.0, 84.0, 84.2], chance=90.0).invalid


def test_a_diverged_run_makes_the_comparison_invalid_and_may_fail_spares_a_collapse_claim():
    # a diverged run counts as 100% error (diverged_as_failed) where the values are errors
    v = studies.lower([5.0, 5.5, 6.0], [20.0, 100.0, 21.0], paired=True, chance=90.0)
    assert v.invalid and "1 of its 3 runs diverged" in v.why
    # other values may pass 100 (a loss gap of +120%): not a divergence
    v = studies.lower([5.0, 5.5, 6.0], [120.0, 130.0, 125.0], paired=True)
    assert v.replayed is True and not v.invalid
    # "without scaling the run collapses": the collapsing arm is the claim, not a failure of it
    v = studies.worse_by([89.5, 90.0, 89.8], [20.0, 21.0, 20.5], 5.0, chance=90.0, may_fail="x")
    assert v.replayed is True and not v.invalid


def test_within_is_an_equivalence_margin_on_both_sides():
    # +2.0 with tight seeds: the interval lies wholly above +1.5
    assert studies.within([4.6, 4.7, 4.8], [2.6, 2.7, 2.8], 1.5, paired=True).replayed is False
    # -2.0: wholly below -1.5, not "within" either (the old one-sided rule replayed this)
    assert studies.within([0.6, 0.7, 0.8], [2.6, 2.7, 2.8], 1.5, paired=True).replayed is False
    # +1.0 with tight seeds: wholly inside ±1.5
    assert studies.within([3.6, 3.7, 3.85], [2.6, 2.7, 2.8], 1.5, paired=True).replayed is True
    # +1.5 on the margin: undecided
    assert studies.within([4.0, 4.2, 4.4], [2.6, 2.7, 2.8], 1.5, paired=True).replayed is None


def test_no_worse_is_a_one_sided_margin():
    # 2 points better: "no more than 1 point worse" holds (two-sided within would not)
    assert studies.no_worse([0.6, 0.7, 0.8], [2.6, 2.7, 2.8], 1.0, paired=True).replayed is True
    assert studies.no_worse([4.6, 4.7, 4.8], [2.6, 2.7, 2.8], 1.0, paired=True).replayed is False


def test_worse_by_needs_the_interval_beyond_the_threshold():
    assert studies.worse_by([80.0, 79.0, 81.0], [5.0, 4.0, 4.5], 5.0).replayed is True
    assert studies.worse_by([8.0, 9.0, 8.5], [5.0, 4.0, 4.5], 10.0).replayed is False


def test_a_non_finite_result_is_invalid_as_a_diverged_run():
    v = studies.lower([math.nan, 3.0], [5.0, 6.0])
    assert v.replayed is None and v.invalid


def test_a_verdict_needs_exactly_one_threshold():
    with pytest.raises(ValueError, match="exactly one"):
        studies.verdict([1.0], [2.0])
    with pytest.raises(ValueError, match="exactly one"):
        studies.verdict([1.0], [2.0], more_than=0.0, within=1.0)


def test_finding_appends_the_test_and_the_reason_when_undecided_or_invalid():
    decided = studies.finding("c", studies.Verdict(True), "4% vs 6%")
    undecided = studies.finding("c", studies.Verdict(None, "why"), "4% vs 6%")
    invalid = studies.finding("c", studies.Verdict(None, "dead arm", invalid=True), "4% vs 6%")
    assert decided.evidence == "4% vs 6%" and decided.replayed is True
    assert undecided.evidence == "4% vs 6%; undecided: why" and undecided.replayed is None
    assert invalid.evidence == "4% vs 6%; invalid: dead arm" and invalid.outcome == "invalid"
    tested = studies.finding("c", studies.lower([3.5, 4.0, 4.5], [5.5, 6.0, 6.5]), "e")
    assert tested.evidence.startswith("e; Δ +2.00 points, 95% CI [+0.87, +3.13] (Welch t, n = 3)")
    assert tested.p == tested.p_for < 0.05 and tested.p_against == 1.0


def test_every_replays_only_when_each_part_does_and_fails_when_one_fails():
    yes = studies.lower([3.5, 4.0, 4.5], [5.5, 6.0, 6.5])
    no = studies.lower([5.5, 6.0, 6.5], [3.5, 4.0, 4.5])
    open_ = studies.lower([2.0, 4.0, 6.0], [4.0, 4.5, 5.0])
    both = studies.every(yes, yes)
    assert both.replayed is True and both.p_for == yes.p_for
    assert studies.every(yes, no).replayed is False
    assert studies.every(yes, open_).replayed is None
    # a part without a test (a gate) never lets the whole replay
    assert studies.every(yes, studies.Verdict(None, "no run")).replayed is None
    dead = studies.Verdict(None, "an arm did not train", invalid=True)
    assert studies.every(yes, dead).invalid


def test_a_diverged_run_counts_as_full_error_and_the_input_is_untouched():
    import pandas as pd

    df = pd.DataFrame({"status": ["completed", "diverged"], "final_top1_error_pct": [4.0, 12.0]})
    out = studies.diverged_as_failed(df)
    assert list(out["final_top1_error_pct"]) == [4.0, 100.0]
    assert list(out["diverged"]) == [False, True]
    assert list(df["final_top1_error_pct"]) == [4.0, 12.0] and "diverged" not in df


def test_wins_counts_the_seeds_where_one_arm_is_lower_of_those_both_ran():
    import pandas as pd

    df = pd.DataFrame(
        {
            "seed": [0, 0, 1, 1, 2, 2, 3],
            "k": [8.0] * 7,
            "decay": [False, True] * 3 + [False],
            "final_top1_error_pct": [30.0, 31.0, 33.0, 32.0, 29.0, 35.0, 20.0],
        }
    )
    # seed 3 ran one arm only: not counted; seed 1 is the one the other arm wins
    assert studies.wins(df, "decay", False, True) == (2, 3)
    assert studies.wins(df, "decay", True, False, k=8.0) == (1, 3)
    assert studies.wins(df, "decay", False, True, k=16.0) == (0, 0)  # no run matches


def test_paired_seeds_judge_the_difference_by_the_spread_of_their_differences():
    # every seed 1.0-2.0 points better, though each arm alone spreads 2 points: decided when paired
    a, b = [2.0, 4.0, 6.0], [3.5, 5.0, 8.0]
    assert studies.lower(a, b).replayed is None
    v = studies.lower(a, b, paired=True)  # differences -1.5, -1, -2: mean -1.5, stdev 0.5
    assert v.replayed is True and "paired t, n = 3" in v.test
    # the same means with the seeds shuffled: the differences scatter, undecided
    v = studies.lower(a, [8.0, 3.5, 5.0], paired=True)  # -6, 0.5, 1
    assert v.replayed is None and "pairs of seeds" in v.why
    with pytest.raises(ValueError, match="one value per seed"):
        studies.lower([1.0, 2.0], [1.0], paired=True)


def test_an_undecided_verdict_names_the_seeds_a_paired_t_test_needs_for_80_percent_power():
    # differences -6, 0.5, 1: an effect of 1.5 at sd sqrt(30.5 / 2) = 3.905 (Cohen's d 0.384)
    v = studies.lower([2.0, 4.0, 6.0], [8.0, 3.5, 5.0], paired=True)
    n = studies.seeds_to_decide(1.5, 3.905)
    assert v.replayed is None and f"80% power would take {n} pairs of seeds" in v.why
    assert n == 56  # statsmodels' TTestPower: 55.2 pairs for d = 0.384 at α = 0.05, two-sided
    # equal means: no number of seeds separates them
    v = studies.lower([2.0, 4.0, 6.0], [3.0, 3.0, 6.0], paired=True)
    assert v.replayed is None and "no number of seeds decides" in v.why


# -- which notebooks a profile replays (make reproduce) ------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("[0-9]*_*.ipynb"))


def test_a_profile_replays_its_own_studies_in_notebook_order(capsys):
    from lbsgd import cli
    from lbsgd.lab.studies import scales

    # no list: every study whose settings it has (cpu has no ladder for 15, nor so for 16, and
    # no design for 17)
    ladder = ("steps_to", "16_plan", "17_optimizers_at_scale")
    assert scales.notebooks("cpu", NOTEBOOKS) == [
        p for p in NOTEBOOKS if not any(s in p for s in ladder)
    ]
    assert scales.notebooks("smoke", NOTEBOOKS) == NOTEBOOKS
    # no list and no tuning settings nor ladder: every study but 14, 15 and 16, which need them
    cifar = [Path(p).stem for p in scales.notebooks("cifar10", NOTEBOOKS)]
    assert cifar == [
        Path(p).stem for p in NOTEBOOKS if "optimizers" not in p and not any(s in p for s in ladder)
    ]
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
        "16_plan",
    ]
    # every study a profile names has its notebook (a misspelt study would silently drop one)
    studies_of = {Path(p).stem.split("_", 1)[1] for p in NOTEBOOKS}
    for name, profile in scales.PROFILES.items():
        assert set(profile.studies or ()) <= studies_of, name
    # the command make reproduce calls: the same list; a bad profile in one line
    assert cli.main(["reproduce", "fashion", *NOTEBOOKS, "--dry-run"]) == 0
    ran = [ln.split()[3] for ln in capsys.readouterr().out.splitlines() if "execute" in ln]
    assert ran == scales.notebooks("fashion", NOTEBOOKS)
    assert cli.main(["reproduce", "fashon", *NOTEBOOKS]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("lbsgd: error: profile='fashon' is not one of") and "fashion" in err
    assert len(err.splitlines()) == 1
