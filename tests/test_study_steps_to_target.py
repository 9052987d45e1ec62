"""Study 15 (lbsgd.lab.studies.steps_to_target): the steps to a target error on hand-made curves with
known answers, the per-k choice of lr with the grid-edge rule, the slope test against scipy's
textbook formulas, and the findings on ladders whose answer is known."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from lbsgd.config import ConfigError
from lbsgd.lab import stats
from lbsgd.lab.studies import grid_edge, scales
from lbsgd.lab.studies import steps_to_target as stt

SMOKE, LONG, CPU = scales.get("smoke"), scales.get("fashion-long"), scales.get("cpu")


def evals(points, key=stt.ERROR):
    """Evaluation records at (step, error) points, with a train record between that has no error."""
    rows = [{"kind": "eval", "step": s, key: e} for s, e in points]
    rows.insert(1, {"kind": "train", "step": 1, "loss": 2.0})
    return pd.DataFrame(rows)


# -- one run's steps to the target -------------------------------------------------------------


def test_the_crossing_is_interpolated_linearly_in_log_step_between_the_two_evaluations():
    curve = evals([(1, 90.0), (2, 50.0), (4, 30.0), (8, 10.0)])
    # 40 lies halfway from 50 (step 2) to 30 (step 4): log2 step 1.5
    assert stt.steps_to_error(curve, 40.0) == pytest.approx(2**1.5)
    # exactly at an evaluation's value: that step
    assert stt.steps_to_error(curve, 30.0) == pytest.approx(4.0)
    # 20 lies halfway from 30 (step 4) to 10 (step 8): 2^2.5
    assert stt.steps_to_error(curve, 20.0) == pytest.approx(2**2.5)


def test_a_target_the_first_evaluation_already_meets_is_that_step():
    assert stt.steps_to_error(evals([(3, 20.0), (6, 10.0)]), 25.0) == 3.0


def test_a_target_never_reached_is_none():
    assert stt.steps_to_error(evals([(1, 90.0), (2, 50.0), (4, 30.0)]), 29.9) is None
    assert stt.steps_to_error(pd.DataFrame([{"kind": "train", "step": 1, "loss": 1.0}]), 50) is None


def test_a_noisy_curve_that_crosses_twice_counts_its_first_crossing():
    # down through 40 between steps 2 and 4, back up at 8, down again at 16
    curve = evals([(1, 90.0), (2, 60.0), (4, 20.0), (8, 55.0), (16, 15.0)])
    # from 60 to 20, 40 is half way: 2^1.5, not the second crossing between 8 and 16
    assert stt.steps_to_error(curve, 40.0) == pytest.approx(2**1.5)


def test_evaluations_without_the_held_out_error_are_skipped_and_order_does_not_matter():
    rows = [
        {"kind": "eval", "step": 8, stt.ERROR: 10.0},
        {"kind": "eval", "step": 4, "top1_error_pct": 5.0},  # a test-only record: not read
        {"kind": "eval", "step": 2, stt.ERROR: 50.0},
    ]
    assert stt.steps_to_error(pd.DataFrame(rows), 30.0) == pytest.approx(2 ** (1 + 2 * 0.5))


# -- the grid-edge rule ------------------------------------------------------------------------


def test_a_choice_on_the_grid_edge_is_named_and_one_inside_it_is_not():
    grid = [0.5, 1.0, 2.0]
    assert grid_edge(grid, 0.5) == "low"
    assert grid_edge(grid, 2.0) == "high"
    assert grid_edge(grid, 1.0) == ""
    assert grid_edge([4, 1, 2, 0.5, 0.25], 0.25) == "low"  # in any order
    with pytest.raises(ValueError, match="three values"):
        grid_edge([1.0, 2.0], 1.0)


def test_the_lr_grid_needs_an_inside_and_bad_targets_are_one_line():
    assert stt.lr_grid(None) == stt.lr_grid(None, SMOKE) == stt.LR_FACTORS
    assert stt.lr_grid(None, LONG) == stt.SETTINGS["fashion-long"]["lr_factors"]
    assert stt.lr_grid([2, 0.5, 1]) == (0.5, 1, 2)
    for bad in ([1, 2], [1, 1, 2], [0.5, 1, -2], [0.5, 1, True]):
        with pytest.raises(ConfigError, match=r"^lr_factors=.*three or more distinct"):
            stt.lr_grid(bad)
    assert stt.target_of(SMOKE) == stt.SETTINGS["smoke"]["target"]
    for bad in (0, 100, -1, True, "10"):
        with pytest.raises(ConfigError, match=r"^target=.*0 < target < 100"):
            stt.target_of(SMOKE, bad)
    with pytest.raises(ConfigError, match=r"^profile='cpu' has no ladder.*valid: smoke, fashion"):
        stt.trials(CPU)


# -- the runs ----------------------------------------------------------------------------------


def test_fashion_long_ladder_runs_a_constant_lr_past_its_warmup_at_most_4_epochs():
    t = stt.trials(LONG)
    assert len(t) == len(stt.SETTINGS["fashion-long"]["ks"]) * len(
        stt.SETTINGS["fashion-long"]["lr_factors"]
    )
    assert {(r["schedule"], tuple(r["milestones"]), r["epochs"]) for r in t} == {("step", (), 4)}
    # the grid brackets the replay's choices (k = 64 at x 0.125, k = 16 at x 0.25) and the
    # linear rule, x2 apart
    factors = sorted(stt.SETTINGS["fashion-long"]["lr_factors"])
    assert factors[0] < 0.125 and factors[-1] > 1.0
    assert all(b == 2 * a for a, b in zip(factors, factors[1:], strict=False))


def test_the_notebooks_epochs_shorten_the_ladder_as_every_other_run():
    short = scales.get("fashion-long", epochs=2)
    assert {r["epochs"] for r in stt.trials(short)} == {2}
    assert short.base["epochs"] == 2 and stt.SETTINGS["fashion-long"]["keys"]["epochs"] == 4


def test_the_trials_are_every_k_at_every_lr_factor_with_the_tuning_seed_and_probes_on():
    t = stt.trials(SMOKE)
    lad = stt.SETTINGS["smoke"]
    assert len(t) == len(lad["ks"]) * len(stt.LR_FACTORS)
    base = stt.base_lr(SMOKE)
    assert sorted({r["base_lr"] for r in t}) == [base * f for f in stt.LR_FACTORS]
    assert {r["seed"] for r in t} == {lad["seeds"][0]}
    assert {r["holdout"] for r in t} == {lad["holdout"]}
    assert {r["eval_per_octave"] for r in t} == {stt.PER_OCTAVE}
    assert {r["epochs"] for r in t} == {lad["keys"]["epochs"]}
    assert {r["batch_size"] for r in t} == {k * SMOKE.base["reference_batch"] for k in lad["ks"]}
    # the noise probe wherever the batch exceeds B_small (16)
    assert all(r["noise_scale"] == (r["batch_size"] > 16) for r in t)
    # each ends at the ladder's target (stop_at_error), or at the notebook's own
    assert {r["stop_at_error"] for r in t} == {lad["target"]}
    assert {r["stop_at_error"] for r in stt.trials(SMOKE, target=12.5)} == {12.5}
    chosen = pd.DataFrame({"k": [lad["ks"][0]], "lr_factor": [1.0]})
    confirm = stt.confirmations(SMOKE, chosen, [7, 8], target=12.5)
    assert [(r["seed"], r["stop_at_error"]) for r in confirm] == [(7, 12.5), (8, 12.5)]


# -- per k: the choice, and the findings on known ladders ----------------------------------------


def ladder(steps_of, ks=(1, 2, 4, 8, 16, 32), seeds=(0, 1), factors=stt.LR_FACTORS, noise=None):
    """A measured ladder: steps_of(k, factor, seed) -> steps (None: never), batch 16 k;
    noise(k, seed) -> B_noise at the target (default 400 above batch 16)."""
    rows = []
    for k in ks:
        for f in factors:
            for s in seeds:
                steps = steps_of(k, f, s)
                if steps is False:  # this run does not exist (a confirmation not made)
                    continue
                rows.append(
                    {
                        "k": float(k),
                        "batch_size": 16 * k,
                        "lr_factor": f,
                        "lr": 0.05 * k * f,
                        "seed": s,
                        "steps_to_target": math.nan if steps is None else float(steps),
                        "b_noise_target": (
                            noise(k, s) if noise else 400.0 if 16 * k > 16 else math.nan
                        ),
                        "final_val_top1_error_pct": 15.0,
                        "total_steps": 30_000 // k,
                    }
                )
    return pd.DataFrame(rows)


def perfect_then_flat(k, f, s):
    """Steps 4000/k up to k = 8, then 500 · 2^(-0.2·log2(k/8)) (a doubling saves 13%); the lr
    factor 1 fastest, 0.5 and 2 x1.5 slower; seed 1 x1.05 slower than seed 0."""
    steps = 4000 / k if k <= 8 else 500 * (k / 8) ** -0.2
    return steps * (1.0 if f == 1.0 else 1.5) * (1.05 if s == 1 else 1.0)


def test_each_k_chooses_the_fewest_steps_of_the_tuning_seed_ties_to_the_smaller_lr():
    c = stt.choose(ladder(perfect_then_flat), tuning_seed=0)
    assert list(c["lr_factor"]) == [1.0] * 6 and set(c["lr_at_grid_edge"]) == {""}
    # the steps of the choice: the measuring seeds' (seed 1's), not the tuning seed's
    assert c["steps_to_target"].iloc[0] == pytest.approx(4000 * 1.05)
    assert set(c["seeds"]) == {1}
    tie = stt.choose(ladder(lambda k, f, s: 100.0), tuning_seed=0)
    assert set(tie["lr_factor"]) == {0.5} and set(tie["lr_at_grid_edge"]) == {"low"}
    # a factor whose tuning run never reaches the target loses to any that does
    never = stt.choose(ladder(lambda k, f, s: None if f == 1.0 else 10.0 * f), tuning_seed=0)
    assert set(never["lr_factor"]) == {0.5}


def test_the_choice_reads_the_tuning_seed_alone_and_needs_every_seed_for_its_steps():
    # seed 1 only at the chosen factor (the confirmations); there it never reaches the target
    def steps(k, f, s):
        if s == 1:
            return None if f == 1.0 else False
        return 100.0 if f == 1.0 else 200.0

    c = stt.choose(ladder(steps), tuning_seed=0)
    assert set(c["lr_factor"]) == {1.0} and set(c["reached"]) == {0} and set(c["seeds"]) == {1}
    assert c["steps_to_target"].isna().all()


def test_perfect_scaling_up_to_k_star_and_diminishing_returns_beyond_replay():
    found = stt.findings(ladder(perfect_then_flat), large_k=8, tuning_seed=0)
    halves, beyond, b_crit = found
    assert halves.replayed is True and "slope of log2 steps on log2 batch -1.00" in halves.evidence
    assert "; ;" not in halves.evidence and halves.evidence.startswith("steps to the target: k=1")
    assert beyond.replayed is True  # slope -0.2 > -0.75
    assert b_crit.paper.startswith("McCandlish")


def test_steps_that_fall_as_one_over_root_b_do_not_halve():
    def sqrt_rule(k, f, s):
        return 4000 / math.sqrt(k) * (1.0 if f == 1.0 else 1.5) * (1.02 if s else 1.0)

    halves, beyond, _ = stt.findings(ladder(sqrt_rule), large_k=8, tuning_seed=0)
    assert halves.replayed is False and "-0.50" in halves.evidence
    assert beyond.replayed is True


def test_the_halving_claim_prints_its_band_and_the_measured_factor_per_doubling():
    """fashion-long's slope -0.85 is x1.80 per doubling, not a halving: the claim names the band
    the margin allows (x1.68 to x2.38) and the evidence the factor and its interval, 2^-slope at
    the ends of scipy's interval of the slope."""
    scatter = {1: 1.0, 2: 1.1, 3: 0.95}

    def by_1_8(k, f, s):
        return 4000 * 1.8 ** -math.log2(k) * (1.0 if f == 1.0 else 1.5) * scatter.get(s, 1.0)

    m = ladder(by_1_8, ks=(1, 2, 4, 8), seeds=(0, 1, 2, 3))
    halves = stt.findings(m, large_k=8, tuning_seed=0)[0]
    assert halves.claim == (
        "the steps to the target halve as the batch doubles up to k=8 (within the margin: each "
        "doubling divides them by x1.68 to x2.38)"
    )
    chosen = m[(m["lr_factor"] == 1.0) & (m["seed"] != 0)]
    r = sps.linregress(np.log2(chosen["batch_size"]), np.log2(chosen["steps_to_target"]))
    half = sps.t.ppf(0.975, len(chosen) - 2) * r.stderr
    assert 2**-r.slope == pytest.approx(1.8)
    assert (
        f"each doubling divides the steps by x1.80, 95% CI [x{2 ** -(r.slope + half):.2f}, "
        f"x{2 ** -(r.slope - half):.2f}] (halving: x2)" in halves.evidence
    )


def test_a_k_whose_best_lr_sits_on_the_edge_makes_the_claims_that_read_it_invalid():
    def edge_at_4(k, f, s):
        return perfect_then_flat(k, f, s) * ((0.5 if f == 2.0 else 1.0) if k == 4 else 1.0)

    halves, beyond, _ = stt.findings(ladder(edge_at_4), large_k=8, tuning_seed=0)
    assert halves.invalid and halves.replayed is None
    assert "k=4's best lr sits on the high edge of its grid" in halves.evidence
    assert not beyond.invalid and beyond.replayed is True  # k = 4 is not beyond k* = 8


def test_the_fit_recovers_a_known_s_min_and_b_crit():
    # S(B) = 100 (1 + 1600/B): S_min 100, B_crit 1600, E_min 160,000
    def model(k, f, s):
        return 100 * (1 + 1600 / (16 * k)) * (1.0 if f == 1.0 else 2.0)

    m = ladder(model, seeds=(0,))
    c = stt.choose(m, tuning_seed=0)
    f = stt.seed_steps(m, c, 0).fit()
    assert f.s_min == pytest.approx(100) and f.b_crit == pytest.approx(1600)
    t = stt.table(c, f)
    assert t["perfect_scaling_steps"].iloc[1] == pytest.approx(t["steps_to_target"].iloc[0] / 2)
    assert t["fit_steps"].to_numpy() == pytest.approx(t["steps_to_target"].to_numpy())


def test_each_doubling_is_named_by_the_steps_it_saves():
    m = ladder(perfect_then_flat, ks=(1, 2, 4, 8, 16, 64))
    c = stt.choose(m, tuning_seed=0)
    t = stt.table(c, stt.seed_steps(m, c, 0).fit())
    saved = list(t["saved_by_doubling"])
    assert saved[:3] == pytest.approx([2.0, 2.0, 2.0])
    # 8 -> 16: 4000/8 = 500 to 500·2^-0.2; 16 -> 64 (two doublings): 2^0.2 per doubling
    assert saved[3] == pytest.approx(500 / (500 * 2**-0.2)) and saved[4] == pytest.approx(2**0.2)
    assert math.isnan(saved[5])
    assert list(t["region"]) == ["perfect scaling"] * 3 + ["maximal data parallelism"] * 2 + [""]
    assert stt.region(1.5) == "diminishing returns" and stt.region(2**0.75) == "perfect scaling"


# -- the slope's interval and tests --------------------------------------------------------------


def test_the_slope_interval_is_the_textbook_t_interval_on_n_minus_2_degrees_of_freedom():
    x = np.array([0.0, 0.0, 1.0, 1.0, 2.0, 3.0])
    y = np.array([10.0, 10.3, 8.8, 9.1, 8.2, 6.9])
    sxx = ((x - x.mean()) ** 2).sum()
    b = ((x - x.mean()) * (y - y.mean())).sum() / sxx
    resid = y - (y.mean() + b * (x - x.mean()))
    se = math.sqrt((resid**2).sum() / (len(x) - 2) / sxx)
    half = sps.t.ppf(0.975, len(x) - 2) * se
    iv = stats.slope(x, y)
    assert (iv.diff, iv.low, iv.high, iv.n) == pytest.approx((b, b - half, b + half, 6))
    # the p of slope = b - half against "greater" is 2.5%: the interval's lower end
    t = stats.slope_above(x, y, b - half)
    assert t.p_for == pytest.approx(0.05)
    w = stats.slope_within(x, y, b, half * 1.0001)
    assert w.p_for == pytest.approx(0.05, rel=1e-3)
    with pytest.raises(ValueError, match="three points"):
        stats.slope([0.0, 1.0], [1.0, 2.0])


# -- the jackknife-t interval: B_crit's interval and the x2 claim ---------------------------------


def test_the_band_is_decided_by_its_jackknife_t_interval_inside_across_or_outside():
    """Per-seed values whose geometric mean is the statistic: the jackknife-t interval is the t
    interval of their logs; inside (0.5, 2), across 1.1, wholly above 2: replayed, undecided, not
    replayed; the verdict at 5% agrees with the printed interval at every edge."""
    import scipy.stats as sps

    x = np.exp(np.array([-0.1, 0.05, 0.0, 0.1, -0.05, 0.02]))

    def gm(idx, y=x):
        return float(np.exp(np.log(y[idx]).mean()))

    loo, point = stats.jackknife(6, gm), gm(np.arange(6))
    t = sps.ttest_1samp(np.log(x), 0.0).confidence_interval()
    iv = stats.band(loo, point, 0.5, 2.0, 6).interval
    assert (math.log(iv.low), math.log(iv.high)) == pytest.approx((t.low, t.high))
    assert iv.test == "jackknife-t" and stats.band(loo, point, 0.5, 2.0, 6).p_for < stats.ALPHA
    assert stats.band(loo, point, 0.5, 1.05, 6).p == pytest.approx(
        stats.band(loo, point, 0.5, 1.05, 6).p_for
    )
    assert stats.band(loo, point, 0.5, 1.05, 6).p_for > stats.ALPHA  # across the top end
    above = stats.band(stats.jackknife(6, lambda i: 3 * gm(i)), 3 * point, 0.5, 2.0, 6)
    assert above.p_against < stats.ALPHA and above.p_for == 1.0
    for edge in np.linspace(1.0, 1.2, 41):
        b = stats.band(loo, point, 0.5, edge, 6)
        assert (b.p_for < stats.ALPHA) == (b.interval.high < edge), edge
    # a left-out set without a value (a fit that failed) leaves it undecided
    assert stats.band(np.array([1.0, math.nan]), 1.0, 0.5, 2.0, 2).p == 1.0
    with pytest.raises(ValueError, match="two seeds"):
        stats.jackknife(1, lambda i: 1.0)


def _coverage(n: int, interval, trials: int = 400) -> float:
    """How often ``interval(values, statistic)`` covers the truth: the ratio of two geometric
    means of lognormal per-seed values (true ratio 2), as study 15's and 16's ratios are made."""
    rng = np.random.default_rng(n)
    hits = 0
    for _ in range(trials):
        a, b = np.exp(rng.normal(0, 0.25, n)), np.exp(rng.normal(math.log(2), 0.3, n))

        def ratio(idx, a=a, b=b):
            return float(np.exp(np.log(b[idx]).mean() - np.log(a[idx]).mean()))

        low, high = interval(n, ratio)
        hits += low <= 2.0 <= high
    return hits / trials


def _jackknife_t(n, ratio):
    iv, _ = stats.jackknife_t(stats.jackknife(n, ratio), ratio(np.arange(n)), n)
    return iv.low, iv.high


def _percentile(n, ratio):
    import scipy.stats as sps

    res = sps.bootstrap(
        (np.arange(n),),
        lambda idx: ratio(np.asarray(idx, dtype=int)),
        vectorized=False,
        n_resamples=300,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    return res.confidence_interval.low, res.confidence_interval.high


@pytest.mark.slow
def test_the_seed_intervals_cover_95_percent_at_3_6_and_8_seeds_where_the_percentile_did_not():
    """The claims' intervals over 3-8 seeds hold their 95% (400 simulated studies each: within
    about 2 standard errors); the percentile bootstrap they replace covers about 75% at 3 seeds
    and 86% at 6, and fails the same check."""
    for n in (3, 6, 8):
        assert 0.92 <= _coverage(n, _jackknife_t) <= 0.98, n
    assert _coverage(6, _percentile, trials=200) < 0.92


def mcc(k, f, s):
    """S(B) = 100 (1 + 1600/B) at the lr factor 1 (x2 elsewhere), each seed x(1 + 0.02 s)."""
    return 100 * (1 + 1600 / (16 * k)) * (1.0 if f == 1.0 else 2.0) * (1 + 0.02 * s)


SEEDS = (0, 1, 2, 3, 4, 5, 6)


def test_b_crit_within_x2_of_b_noise_is_decided_by_the_interval_of_their_ratio():
    """B_crit 1600 (every seed's steps one multiple of the model): B_noise 1600 puts the ratio at 1,
    its interval a point: replayed; B_noise 400, ratio 4: not replayed; B_noise 400 or 3,200 seed
    by seed (ratio 1.41 on all six, 0.5 to 4 over the resamples): undecided."""

    def run(noise):
        *_, found = stt.findings(ladder(mcc, seeds=SEEDS, noise=noise), large_k=8, tuning_seed=0)
        return found

    agree, off = run(lambda k, s: 1600.0), run(lambda k, s: 400.0)
    assert (
        agree.replayed is True
        and "ratio 1.00 (the claim: x0.5 to x2); 95% CI [1.00, 1.00] (jackknife-t, n = 6)"
        in (agree.evidence)
    )
    assert "B_crit 1600 [1600, 1600]" in agree.evidence and "of 6 seeds" in agree.evidence
    assert off.replayed is False and "ratio 4.00" in off.evidence
    wide = run(lambda k, s: 400.0 if s % 2 else 3200.0)
    assert wide.replayed is None and "reaches across x2" in wide.evidence


def test_the_tuning_seed_measures_nothing():
    """Seed 0 chose the lrs: its steps and noise scale, however far off, move no number the claims
    or the table read (the measuring seeds 1-6 do)."""

    def wild(k, f, s):
        return mcc(k, f, s) * (50.0 if s == 0 else 1.0)

    def noise(k, s):
        return 1e6 if s == 0 else 1600.0

    def out(steps_of, noise_of):
        m = ladder(steps_of, seeds=SEEDS, noise=noise_of)
        c = stt.choose(m, 0)
        s = stt.seed_steps(m, c, 0)
        return [f.evidence for f in stt.findings(m, 8, 0)], stt.table(c, s.fit(), s)

    (ev, t), (ev0, t0) = out(wild, noise), out(mcc, lambda k, s: 1600.0)
    assert ev == ev0
    assert t.drop(columns="final_val_top1_error_pct").equals(
        t0.drop(columns="final_val_top1_error_pct")
    )
    assert stt.seed_steps(
        ladder(wild, seeds=SEEDS), stt.choose(ladder(wild, seeds=SEEDS), 0), 0
    ).seeds == (1, 2, 3, 4, 5, 6)


def test_the_table_gives_b_crit_s_min_and_each_ks_steps_a_seed_bootstrap_interval():
    m = ladder(mcc, seeds=SEEDS)
    c = stt.choose(m, 0)
    s = stt.seed_steps(m, c, 0)
    t = stt.table(c, s.fit(), s)
    # each seed's steps the model's x(1 + 0.02 s): a resample scales the curve by its seeds'
    # geometric mean g, so B_crit stays 1600 and S_min is 100 g, g between x1.02 and x1.12
    assert t["b_crit_low"].iloc[0] == pytest.approx(1600) == t["b_crit_high"].iloc[0]
    s_lo, s_hi = t["s_min_low"].iloc[0], t["s_min_high"].iloc[0]
    assert 102 - 1e-9 <= s_lo < t["s_min"].iloc[0] < s_hi <= 112 + 1e-9
    # each k's interval spans the seeds' geometric means: from seed 1's x1.02 to seed 6's x1.12
    lo, hi = t["steps_low"].to_numpy(), t["steps_high"].to_numpy()
    base = np.array([100 * (1 + 1600 / (16 * k)) for k in t["k"]])
    assert (lo >= base * 1.02 - 1e-9).all() and (hi <= base * 1.12 + 1e-9).all() and (lo < hi).all()
