"""The verdict as a test (lbsgd.lab.stats, lbsgd.lab.findings): its intervals and p-values are scipy's,
its false-verdict rate is α when nothing is there and its power is what the seed plan says, the
seeds it asks for are statsmodels' power solver's, closeness is an equivalence test, and a
report's claims are held together by Benjamini–Hochberg."""

import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.power import TTestIndPower, TTestPower

from lbsgd.lab import findings as fs
from lbsgd.lab import stats

X = [5.1, 6.3, 4.8, 5.9, 6.6]
Y = [4.0, 4.4, 4.1, 5.2, 4.9]


def test_the_paired_interval_and_p_are_scipys_ttest_rel():
    ref = sps.ttest_rel(X, Y)
    ci = ref.confidence_interval(0.95)
    iv = stats.interval(X, Y, paired=True)
    assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert iv.diff == pytest.approx(np.mean(X) - np.mean(Y), abs=1e-12)
    assert stats.p_at(X, Y, 0.0, paired=True) == pytest.approx(ref.pvalue, abs=1e-12)
    # against a threshold t: the test of the differences minus t (scipy's popmean)
    ref1 = sps.ttest_1samp(np.subtract(X, Y), popmean=0.7)
    assert stats.p_at(X, Y, 0.7, paired=True) == pytest.approx(ref1.pvalue, abs=1e-12)


def test_the_unpaired_interval_and_p_are_scipys_welch_test():
    y = [4.0, 4.4, 4.1]  # unequal sizes and spreads
    ref = sps.ttest_ind(X, y, equal_var=False)
    ci = ref.confidence_interval(0.95)
    iv = stats.interval(X, y, paired=False)
    assert iv.test == "Welch t"
    assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert stats.p_at(X, y, 0.0, paired=False) == pytest.approx(ref.pvalue, abs=1e-12)


def test_a_lone_run_is_judged_by_students_pooled_t_against_the_other_arms_spread():
    ref = sps.ttest_ind([7.5], Y, equal_var=True)
    ci = ref.confidence_interval(0.95)
    iv = stats.interval([7.5], Y, paired=False)
    assert iv.test.startswith("pooled t")
    assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high), abs=1e-12)
    # by hand: the prediction interval 7.5 − ȳ ± t(0.975, 4) · s_y · √(1 + 1/5)
    half = sps.t.ppf(0.975, 4) * np.std(Y, ddof=1) * math.sqrt(1 + 1 / 5)
    assert iv.high - iv.low == pytest.approx(2 * half, abs=1e-12)


def test_a_claims_verdict_follows_its_interval_and_its_p():
    v = fs.verdict(X, Y, more_than=0.0, paired=True)
    lo = stats.interval(X, Y, paired=True).low
    assert lo > 0 and v.replayed is True and v.p == pytest.approx(sps.ttest_rel(X, Y).pvalue)
    # a threshold above the interval: wholly on the other side
    v = fs.verdict(X, Y, more_than=3.0, paired=True)
    assert v.replayed is False and v.p_against < 0.05 and v.p_for == 1.0


def test_equivalence_p_is_twice_the_larger_one_sided_p_and_matches_the_interval():
    x, y = [3.1, 3.0, 3.2, 3.05], [3.0, 3.1, 3.0, 3.0]
    t = stats.equivalent(x, y, 0.5, paired=True)
    d = np.subtract(x, y)
    lower = sps.ttest_1samp(d, -0.5, alternative="greater").pvalue
    upper = sps.ttest_1samp(d, 0.5, alternative="less").pvalue
    assert t.p_for == pytest.approx(2 * max(lower, upper), abs=1e-12)
    iv = t.interval
    assert iv.low > -0.5 and iv.high < 0.5 and t.p_for < 0.05  # inside ±0.5: equivalent
    # the interval at level 1 − p_for just touches the margin
    ci = sps.ttest_rel(x, y).confidence_interval(1 - t.p_for)
    assert max(-ci.low, ci.high) == pytest.approx(0.5, abs=1e-9)


def test_closeness_rejects_goyals_no_warmup_gap_and_accepts_his_gradual_gap():
    # Goyal Table 1: gradual 8k +0.14 over the baseline, no warmup +1.24, sds about 0.1-0.4
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.1, 5)
    base = 23.6 + noise
    assert fs.verdict(base + 0.14, base, within=1.0, paired=True).replayed is True
    assert (
        fs.verdict(base + 1.24 + noise[::-1] * 0.5, base, within=1.0, paired=True).replayed is False
    )


def _decided_share(effect: float, sd: float, n: int, claims: int, seed: int) -> float:
    """The share of ``claims`` synthetic paired claims "x − y > 0" with a true difference
    ``effect`` and per-seed sd ``sd`` over ``n`` seeds that the verdict decides either way."""
    rng = np.random.default_rng(seed)
    decided = 0
    for _ in range(claims):
        y = rng.normal(10.0, 3.0, n)  # the seed's own luck, shared by both arms
        x = y + effect + rng.normal(0.0, sd, n)
        decided += fs.verdict(list(x), list(y), more_than=0.0, paired=True).replayed is not None
    return decided / claims


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 5, 8])
def test_with_no_true_effect_five_percent_of_claims_are_decided(n):
    # 4,000 claims: the share's standard error is 0.34%, so ±1% is about three of them
    share = _decided_share(0.0, 1.0, n, 4000, seed=n)
    assert abs(share - stats.ALPHA) <= 0.01


@pytest.mark.slow
@pytest.mark.parametrize("effect", [0.8, 1.5])
def test_at_the_planned_effect_at_least_eighty_percent_of_claims_are_decided(effect):
    n = stats.seeds_to_decide(effect, 1.0)
    share = _decided_share(effect, 1.0, n, 4000, seed=int(10 * effect))
    # the plan's power is at least 80% (its integer n overshoots a little); Monte Carlo: 0.6%
    assert share >= stats.POWER - 0.02
    assert share == pytest.approx(stats.power(effect, 1.0, n), abs=0.025)


@pytest.mark.parametrize("d", [0.3, 0.5, 0.8, 1.0, 1.2, 2.0, 3.0])
def test_seeds_to_decide_is_statsmodels_power_solver_rounded_up(d):
    paired = TTestPower().solve_power(effect_size=d, alpha=0.05, power=0.8)
    unpaired = TTestIndPower().solve_power(effect_size=d, alpha=0.05, power=0.8, ratio=1.0)
    assert stats.seeds_to_decide(d * 2.0, 2.0) == max(2, math.ceil(paired))
    assert stats.seeds_to_decide(d * 2.0, 2.0, paired=False) == max(2, math.ceil(unpaired))
    n = stats.seeds_to_decide(d, 1.0)
    assert stats.power(d, 1.0, n) == pytest.approx(TTestPower().power(d, n, 0.05), abs=1e-9)


def test_no_number_of_seeds_decides_a_zero_effect():
    assert stats.seeds_to_decide(0.0, 1.0) is None


def _finding(p_for: float, p_against: float = 1.0, invalid: bool = False) -> fs.Finding:
    replayed = None if invalid else (True if p_for < 0.05 else False if p_against < 0.05 else None)
    return fs.Finding("c", replayed, "e", invalid=invalid, p_for=p_for, p_against=p_against)


def test_the_report_controls_false_discoveries_with_scipys_benjamini_hochberg():
    found = [_finding(0.001), _finding(0.04), _finding(1.0, 0.03), _finding(0.5), _finding(0.02)]
    q = sps.false_discovery_control([0.001, 0.04, 0.03, 0.5, 0.02], method="bh")
    out = fs.controlled(found)
    for f, qi in zip(out, q, strict=True):
        assert f"BH q = {qi:.3g} over 5 tested claims" in f.evidence
    # q = 0.005, 0.05, 0.05, 0.5, 0.05: only the first stays decided
    assert [f.replayed for f in out] == [True, None, None, None, None]
    assert "undecided after false-discovery control" in out[1].evidence


def test_invalid_claims_and_measured_claims_stay_out_of_the_family():
    found = [
        _finding(0.01),
        _finding(0.001, invalid=True),
        fs.Finding("model", True, "a cost model's number"),
        fs.Finding("ratio", False, "a fitted ratio beside ×2"),
    ]
    out = fs.controlled(found)
    assert "over 1 tested claims" in out[0].evidence and out[0].replayed is True
    assert out[1:] == found[1:]
    assert [f.outcome for f in out] == ["replayed", "invalid", "measured", "measured"]


def test_a_claim_without_a_test_is_measured_when_decided_and_undecided_without_data():
    # decided from a number with no test (both p's None): measured, whichever side it fell
    assert fs.Finding("c", True, "e").outcome == "measured"
    assert fs.Finding("c", False, "e").outcome == "measured"
    assert not fs.Finding("c", False, "e").decided
    # no data: undecided; an arm that did not train: invalid, test or not
    assert fs.Finding("c", None, "e").outcome == "undecided"
    assert fs.Finding("c", None, "e", invalid=True).outcome == "invalid"
    # any test's p's: the test's outcome
    assert _finding(0.01).outcome == "replayed" and _finding(1.0, 0.01).outcome == "not replayed"
    assert _finding(0.01).decided and _finding(1.0, 0.01).decided
    assert _finding(0.5).outcome == "undecided"
    # a verdict reads the same
    assert fs.Verdict(True).outcome == "measured" and fs.Verdict(None, "no run").outcome == (
        "undecided"
    )


def test_a_verdict_under_s_min_is_budget_bound_and_counted_apart():
    b = fs.Budget({"k=1": 3750, "k=128": 30}, None, "Goyal's 32k run: 3,519")
    f = fs.Finding("c", True, "e", p_for=0.01, p_against=1.0, budget=b)
    assert not f.budget_bound  # no S_min at this profile
    g = fs.with_s_min(f, 61.0)
    assert g.budget_bound and g.evidence == (
        "e; optimizer steps: k=1 3,750, k=128 30; S_min 61; Goyal's 32k run: 3,519; "
        "budget-bound: an arm has fewer steps than S_min"
    )
    assert not fs.with_s_min(fs.Finding("c", True, "e", budget=b), 25.0).budget_bound
    # a measured claim under S_min is counted as measured, not among the decided verdicts
    measured = fs.with_s_min(fs.Finding("m", True, "e", budget=b), 61.0)
    counted = fs.counts([g, fs.Finding("d", None, "e"), _finding(0.5, invalid=True), measured])
    assert counted == (
        "4 claims: 1 replayed, 0 not replayed, 1 undecided, 1 invalid, 1 measured (one number "
        "beside its threshold, no test); 1 of the 1 decided are budget-bound (an arm under S_min)"
    )


def test_a_finding_round_trips_through_its_dict_with_outcome_test_and_budget():
    b = fs.Budget({"k=16": 235}, 61.1, "Goyal's 4k run: 28,151")
    f = fs.Finding("c", None, "e", "paper", True, 0.2, 1.0, b)
    d = f.to_dict()
    assert d["outcome"] == "invalid" and d["budget"]["s_min"] == 61.1
    assert fs.Finding.from_dict(d) == f
    # a findings.json written before outcomes: no test (a decided claim reads measured), no budget
    old = fs.Finding.from_dict({"claim": "c", "replayed": False, "evidence": "e"})
    assert old.outcome == "measured" and old.p is None and old.budget is None


# -- one contrast, three outcomes ----------------------------------------------------------------

# t(0.975, 3): the paired 95% interval of four seeds is mean ± T3 · sd / 2
T3 = 3.182446305284263
# seed-paired arms whose differences b − a are given (a: 10, 11, 12, 13): Δ = mean(b − a)
A = [10.0, 11.0, 12.0, 13.0]


def _arm_b(diffs: list[float]) -> list[float]:
    return [x + d for x, d in zip(A, diffs, strict=True)]


def _by_hand(diffs: list[float]) -> tuple[float, float]:
    m, sd = float(np.mean(diffs)), float(np.std(diffs, ddof=1))
    return m - T3 * sd / 2, m + T3 * sd / 2


@pytest.mark.parametrize(
    ("diffs", "interval", "outcome"),
    [
        # inside ±1 and above 0: matches comes first
        ([0.1, 0.3, 0.2, 0.2], (0.0701, 0.3299), "matches"),
        # wholly above 0, reaching past +1 at both ends or at one
        ([2.0, 2.2, 2.4, 2.2], (1.9401, 2.4599), "beats"),
        ([0.4, 1.6, 1.0, 1.0], (0.2205, 1.7795), "beats"),
        ([-2.0, -2.2, -2.4, -2.2], (-2.4599, -1.9401), "loses"),
        # across 0 and past ±1: undecided
        ([-1.0, 3.0, 1.0, 1.0], (-1.5985, 3.5985), None),
    ],
)
def test_a_contrast_has_one_outcome_from_its_interval(diffs, interval, outcome):
    c = stats.contrast(_arm_b(diffs), A, 1.0, paired=True)
    assert _by_hand(diffs) == pytest.approx(interval, abs=1e-4)
    assert (c.interval.low, c.interval.high) == pytest.approx(interval, abs=1e-4)
    assert c.outcome == outcome
    # each outcome's p is scipy's: TOST at the margins (each one-sided at α/2), the t test of 0
    up = sps.ttest_1samp(diffs, 1.0, alternative="less").pvalue
    down = sps.ttest_1samp(diffs, -1.0, alternative="greater").pvalue
    two = sps.ttest_1samp(diffs, 0.0).pvalue
    assert c.p["matches"] == pytest.approx(min(1.0, 2 * max(up, down)))
    m = np.mean(diffs)
    assert c.p["beats"] == pytest.approx(two if m > 0 else 1.0)
    assert c.p["loses"] == pytest.approx(two if m < 0 else 1.0)


def test_a_contrast_claim_is_replayed_only_when_its_expected_outcome_is_the_decided_one():
    matches = stats.contrast(_arm_b([0.1, 0.3, 0.2, 0.2]), A, 1.0, paired=True)
    beats = stats.contrast(_arm_b([2.0, 2.2, 2.4, 2.2]), A, 1.0, paired=True)
    across = stats.contrast(_arm_b([-1.0, 3.0, 1.0, 1.0]), A, 1.0, paired=True)
    # the expected outcome decided: its p for, nothing against
    t = matches.test("matches")
    assert (t.p_for, t.p_against) == (matches.p["matches"], 1.0) and t.p_for < 0.05
    # another outcome decided: nothing for, the smallest p of the others against; "beats" is
    # below α here too, but matches comes first, so a claim of "beats" is not replayed
    assert matches.p["beats"] < 0.05
    t = matches.test("beats")
    assert (t.p_for, t.p_against) == (1.0, matches.p["matches"])
    t = beats.test("matches")
    assert (t.p_for, t.p_against) == (1.0, beats.p["beats"]) and t.p_against < 0.05
    # undecided: every p at or above α
    t = across.test("matches")
    assert t.p_for == across.p["matches"] and t.p_against == across.p["beats"]
    assert min(t.p_for, t.p_against) >= 0.05
    with pytest.raises(ValueError, match="expected='wins' is not one of"):
        across.test("wins")


def test_a_contrast_verdict_names_its_outcome_and_decides_the_expected_one():
    a, b = A, _arm_b([-2.0, -2.2, -2.4, -2.2])  # b lower: a loses to b
    v = fs.contrast(a, b, margin=1.0, expect="matches", names=("LARS", "Nesterov"), paired=True)
    assert v.replayed is False and v.outcome == "not replayed"
    assert v.test == (
        f"Δ -2.20 points (Nesterov − LARS), 95% CI [-2.46, -1.94] (paired t, n = 4), "
        f"p = {v.p:.3g}; outcome: LARS loses to Nesterov (interval wholly below 0, not inside ±1)"
    )
    assert v.p == pytest.approx(sps.ttest_1samp([-2.0, -2.2, -2.4, -2.2], 0.0).pvalue)
    v = fs.contrast(a, b, margin=1.0, expect="loses", names=("LARS", "Nesterov"), paired=True)
    assert v.replayed is True
    near = fs.contrast(A, _arm_b([0.1, 0.3, 0.2, 0.2]), margin=1.0, expect="matches", paired=True)
    assert near.replayed is True and "outcome: a matches b (interval inside ±1)" in near.test
    wide = fs.contrast(A, _arm_b([-1.0, 3.0, 1.0, 1.0]), margin=1.0, expect="matches", paired=True)
    assert wide.replayed is None and "outcome" not in wide.test
    assert wide.text().startswith(f"; {wide.test}; undecided: the interval covers 0 and is not ")
    # the seeds to decide the side the mean is on (|Δ| = 1 is past half the margin): effect 1
    n = stats.seeds_to_decide(1.0, float(np.std([-1.0, 3.0, 1.0, 1.0], ddof=1)))
    assert f"the observed 1.00 at this spread (1.63), 80% power would take {n} pairs" in wide.why
    # an arm at chance: invalid before any test
    dead = fs.contrast(
        [90.0, 90.5, 89.9],
        [10.0, 11.0, 12.0],
        margin=1.0,
        expect="matches",
        chance=90.0,
        paired=True,
    )
    assert dead.invalid and dead.p is None and dead.outcome == "invalid"


def test_a_contrast_enters_the_false_discovery_control_with_its_claims_p():
    v = fs.contrast(A, _arm_b([2.0, 2.2, 2.4, 2.2]), margin=1.0, expect="matches", paired=True)
    f = fs.Finding("c", v.replayed, "e", p_for=v.p_for, p_against=v.p_against)
    (out,) = fs.controlled([f])
    assert (
        f"BH q = {v.p:.3g} over 1 tested claims" in out.evidence and out.outcome == "not replayed"
    )
