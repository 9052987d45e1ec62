"""Studies 1-5, Goyal et al.'s (lbsgd.lab.studies.quickstart … bn_gamma_init), on hand-made numbers:
each finding replayed, not replayed, undecided (its 95% interval across the threshold, or one run
per arm) and invalid (an arm at chance, e.g. every run at the smoke profile, or a diverged run),
the budgets the large-minibatch findings carry, the run lists of the cpu and smoke profiles, and
the paper's numbers on the right rows of each table.

The expected intervals come from scipy directly (:func:`ci`), not from lbsgd.lab.stats: Student's
paired t on the per-seed differences; a lone run carries no test (measured)."""

import math

import pandas as pd
import pytest
from helpers import verdicts
from scipy import stats as sps

from lbsgd import config
from lbsgd.lab.findings import Budget
from lbsgd.lab.studies import (
    batch_scaling,
    bn_gamma_init,
    lr_scaling_rule,
    quickstart,
    scales,
    warmup,
)

CPU, SMOKE = scales.get("cpu"), scales.get("smoke")
REF = 16  # the cpu and smoke profiles' reference batch


def frame(rows):
    """Runs as ``experiments.load_runs`` gives them: the columns the study modules read."""
    base = {
        "dataset": "synthetic",
        "status": "completed",
        "total_steps": 100,
        "warmup": "gradual",
        "lr_scaling": "linear",
        "model": "resnet",
        "depth": 8,
        "zero_init_residual": False,
    }
    out = pd.DataFrame([{**base, **r} for r in rows])
    out["batch_size"] = (out["k"] * REF).astype(int)
    out["run_dir"] = [f"runs/{i}" for i in range(len(out))]
    return out


def arms(values, **keys):
    """One run per seed (0, 1, …) with these errors and keys."""
    return [{**keys, "seed": s, "final_top1_error_pct": e} for s, e in enumerate(values)]


def undecided_by(findings, reason):
    return all(
        f.replayed is None and not f.invalid and f"undecided: {reason}" in f.evidence
        for f in findings
    )


def invalid_by(findings, reason):
    """Every finding invalid (no verdict, no test) because an arm did not train for ``reason``."""
    return all(
        f.invalid
        and f.replayed is None
        and f.outcome == "invalid"
        and f.p is None
        and f"invalid: an arm did not train ({reason}" in f.evidence
        for f in findings
    )


def ci(x, y):
    """The 95% interval of mean(x) - mean(y) as a finding's evidence prints it, from scipy:
    Student's paired t (``ttest_rel``)."""
    c = sps.ttest_rel(x, y).confidence_interval(0.95)
    return f"95% CI [{c.low:+.2f}, {c.high:+.2f}]"


def diffs(x, y):
    return [a - b for a, b in zip(x, y, strict=True)]


def experiment(keys, study):
    return config.from_dict({**keys, "study": study}).experiment_id()


# -- 1. quickstart -----------------------------------------------------------------------------


def test_quickstart_runs_one_run_at_k16_with_the_first_seed():
    for p in (CPU, SMOKE):
        (run,) = quickstart.runs(p, [3, 4])
        assert run["batch_size"] == 16 * p.base["reference_batch"] and run["seed"] == 3
        assert run["warmup"] == "gradual"
    assert quickstart.runs(CPU, [0], k=4)[0]["batch_size"] == 64


@pytest.mark.parametrize(
    ("err", "verdict", "why"),
    [
        (3.9, True, None),
        (69.0, True, None),  # 21 points below chance
        (71.0, None, "one run, 19.0 points below chance (the claim: over 20)"),
        (75.0, None, "one run, 15.0 points below chance (the claim: over 20)"),
        (88.0, None, "one run, 2.0 points below chance (the claim: over 20)"),
    ],  # smoke: the run ends at chance, short of the allowance like any other: undecided
)
def test_quickstart_learns_when_twenty_points_below_chance(err, verdict, why):
    # one run against a number: no interval, so no test; the allowance decides, and a run short
    # of it is undecided, never "not replayed" nor invalid
    (f,) = quickstart.findings(frame(arms([err], k=16)))
    assert f.replayed is verdict, f
    assert not f.invalid and f.p_for is None and f.p_against is None
    assert f.evidence.startswith(
        f"top-1 error {err:.1f}% vs chance 90% (the claim: over 20 points below it, under 70%)"
    )
    assert f.outcome == ("undecided" if verdict is None else "measured")
    assert "CI" not in f.evidence
    if why is None:
        assert "undecided" not in f.evidence
    else:
        assert f.evidence.endswith(f"; undecided: {why}: no seed spread to judge it by")


def test_quickstart_a_diverged_run_has_not_learned():
    (f,) = quickstart.findings(frame(arms([12.0], k=16, status="diverged")))
    assert f.replayed is False and "the run diverged" in f.evidence


def test_quickstart_is_undecided_when_the_chance_error_is_unknown():
    (f,) = quickstart.findings(frame(arms([3.9], k=16, dataset="plugin_data")))
    assert f.replayed is None and "chance error is unknown" in f.evidence


def test_quickstart_table_has_the_run_and_its_numbers():
    df = frame(arms([3.9], k=16, run="r", lr=0.2, final_top5_error_pct=0.1, img_per_s=10.0))
    t = quickstart.table(df)
    assert list(t.columns) == quickstart.COLUMNS and t["batch_size"].tolist() == [256]


# -- 2. warmup ---------------------------------------------------------------------------------


def warmup_df(base, none, constant, gradual, large_k=16, steps=(5000, 313), warmup_epochs=0.0):
    keys = {"warmup_epochs": warmup_epochs, "epochs": 4.0}
    rows = arms(base, k=1, warmup="none", total_steps=steps[0], **keys)
    for w, e in (("none", none), ("constant", constant), ("gradual", gradual)):
        rows += arms(e, k=large_k, warmup=w, total_steps=steps[1], **keys)
    return frame(rows)


def jump_curve(peak):
    """A constant warmup's training records: lr 0.1 for 20 steps, then 1.6; loss 1.0 before the
    jump, ``peak`` at it, 0.9 after."""
    loss = [1.0] * 20 + [peak] + [0.9] * 19
    lr = [0.1] * 20 + [1.6] * 20
    return pd.DataFrame(
        {"kind": "train", "epoch": [i / 10 for i in range(40)], "lr": lr, "loss": loss}
    )


def constant_curves(df, peak):
    const = df[df["warmup"] == "constant"]["run_dir"]
    return {d: jump_curve(peak) for d in const}


def test_warmup_jump_ratio_is_the_peak_after_the_jump_over_the_loss_before():
    assert warmup.jump_ratio(jump_curve(1.5)) == pytest.approx(1.5)
    flat = jump_curve(1.0).assign(lr=0.1)  # the lr never rises: no jump to measure
    assert math.isnan(warmup.jump_ratio(flat))


def test_warmup_runs_pair_the_seeds_of_the_baseline_and_each_warmup():
    runs = warmup.runs(CPU, [0, 1, 2])
    assert len(runs) == 12
    arms_ = {}
    for r in runs:
        arms_.setdefault((r["batch_size"], r["warmup"]), []).append(r["seed"])
    assert arms_ == {
        (16, "none"): [0, 1, 2],
        (256, "none"): [0, 1, 2],
        (256, "constant"): [0, 1, 2],
        (256, "gradual"): [0, 1, 2],
    }
    smoke = warmup.runs(SMOKE, list(SMOKE.seeds))
    assert [(r["batch_size"], r["warmup"], r["seed"]) for r in smoke] == [
        (16, "none", 0),
        (128, "none", 0),
        (128, "constant", 0),
        (128, "gradual", 0),
    ]
    assert [r["batch_size"] for r in warmup.runs(CPU, [0], ks=[2, 8])] == [32, 128, 128, 128]


# The cpu profile's large k = 16 is 4k by k · 256; Table 1 reports 8k only.
MAPPED = "; k=16 is 4k by k · 256, Table 1 reports 8k only"
# Seeds 0-2 of the large minibatch with tight, unequal per-seed differences to the baseline
# BASE: none +4.0 (gradual 3.9 better), constant 3.0 above none, gradual +0.1 to +0.15.
BASE, NONE, CONSTANT, GRADUAL = [2.0, 2.1, 2.2], [6.0, 6.2, 6.1], [9.0, 9.1, 9.3], [2.1, 2.25, 2.3]


def test_warmup_replayed_when_every_interval_lies_on_the_claims_side():
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL)
    fs = warmup.findings(df, metrics={})  # the curves are read only to explain a claim not shown
    assert verdicts(fs) == [True, True, True]
    # gradual beats none: none - gradual [3.9, 3.95, 3.8], its interval wholly above 0
    assert fs[0].evidence.startswith(
        f"2.2% vs 6.1% (mean of 3; paper 23.74 vs 24.84{MAPPED}); Δ +3.88 points, "
        f"{ci(NONE, GRADUAL)} (paired t, n = 3), p = "
    )
    # constant worst: above none and above gradual, both intervals wholly above 0
    assert fs[1].evidence.startswith(
        "constant 9.1%, none 6.1%, gradual 2.2% (paper 25.88 worst); Δ +3.03 points, "
        f"{ci(CONSTANT, NONE)} (paired t, n = 3)"
    )
    assert f" and Δ +6.92 points, {ci(CONSTANT, GRADUAL)} (paired t, n = 3)" in fs[1].evidence
    # close: gradual - baseline [0.1, 0.15, 0.1], its interval [+0.04, +0.19] inside ±1
    assert ci(GRADUAL, BASE) == "95% CI [+0.04, +0.19]"
    assert fs[2].evidence.startswith(
        f"2.2% vs baseline 2.1% (paper 23.74 vs 23.60{MAPPED}); Δ +0.12 points, "
        f"{ci(GRADUAL, BASE)} (paired t, n = 3)"
    )
    assert all(f.p_for < 0.05 and f.p_against == 1.0 for f in fs)
    assert not any("undecided" in f.evidence or f.invalid for f in fs)
    # at k = 32, 8k by k · 256 as in Table 1, no mapping is named
    f = warmup.findings(warmup_df(BASE, NONE, CONSTANT, GRADUAL, large_k=32), metrics={})[0]
    assert f.evidence.startswith("2.2% vs 6.1% (mean of 3; paper 23.74 vs 24.84); Δ")


def test_warmup_not_replayed_says_why_at_this_scale_from_the_curves():
    # gradual 2 points above none, constant between them, gradual 4 above the baseline: every
    # interval wholly on the other side (per-seed differences tight but not equal)
    df = warmup_df(BASE, [4.0, 4.2, 4.1], [5.0, 5.1, 5.3], [6.0, 6.15, 6.2])
    fs = warmup.findings(df, metrics=constant_curves(df, peak=1.5))
    assert verdicts(fs) == [False, False, False]
    assert (
        "not replayed at this scale: the jump at the end of the constant warmup raises the loss "
        "(its peak after the jump is 1.50x the mean just before, mean of 3)" in fs[1].evidence
    )
    assert "constant is still worse than gradual" not in fs[1].evidence  # 5.1 < 6.1
    assert all(f.p_against < 0.05 and f.p_for == 1.0 for f in fs)
    assert (
        "not replayed at this scale: the large minibatch gets 313 optimizer steps here (the "
        "baseline 5000" in fs[2].evidence
    )
    # a loader works as well as a mapping; a small jump "barely disturbs training"
    small = constant_curves(df, peak=1.05)
    f = warmup.findings(df, metrics=lambda d: small[d])[1]
    assert "barely disturbs training here (the loss after the jump peaks at 1.05x" in f.evidence


def test_warmup_undecided_when_the_intervals_reach_across_their_thresholds():
    # means in the claims' direction (none 6.0 > gradual 4.8; constant 7.0 the worst; gradual
    # 0.8 from the baseline) but per-seed differences of ±4 points: every interval is wide
    base, none, constant, gradual = (
        [2.0, 4.0, 6.0],
        [9.0, 3.0, 6.0],
        [4.0, 10.0, 7.0],
        [5.0, 7.5, 2.0],
    )
    fs = warmup.findings(warmup_df(base, none, constant, gradual), metrics={})
    assert verdicts(fs) == [None, None, None]
    assert not any(f.invalid for f in fs)
    assert f"{ci(none, gradual)} (paired t, n = 3)" in fs[0].evidence
    assert "undecided: the interval reaches across the threshold +0" in fs[0].evidence
    assert "undecided: the interval reaches across the threshold +0" in fs[1].evidence
    low, high = sps.ttest_rel(gradual, base).confidence_interval()
    assert low < -1 < 1 < high  # across both bounds of the margin
    assert "undecided: the interval reaches across the margin ±1" in fs[2].evidence
    assert all("80% power would take" in f.evidence for f in fs)
    assert "not replayed" not in " ".join(f.evidence for f in fs)


def test_warmup_gradual_close_is_an_equivalence_within_one_point_of_the_baseline():
    def close(gradual):
        return warmup.findings(warmup_df(BASE, NONE, CONSTANT, gradual), metrics={})[2]

    # Goyal's no-warmup gap, +1.24, with tight seeds: the interval [+1.19, +1.29] wholly outside
    far = [3.22, 3.34, 3.46]  # +1.22, +1.24, +1.26
    f = close(far)
    assert ci(far, BASE) == "95% CI [+1.19, +1.29]"
    assert f.replayed is False and f"Δ +1.24 points, {ci(far, BASE)}" in f.evidence
    assert f.p_against < 0.05 and f.p_for == 1.0
    assert "not replayed at this scale: the large minibatch gets 313 optimizer steps" in f.evidence
    # Goyal's gradual-warmup gap, about +0.1, with tight seeds: the interval wholly inside ±1
    near = [2.08, 2.2, 2.32]  # +0.08, +0.10, +0.12
    f = close(near)
    assert ci(near, BASE) == "95% CI [+0.05, +0.15]"
    assert f.replayed is True and f"Δ +0.10 points, {ci(near, BASE)}" in f.evidence
    # two-sided: 1.26 points below the baseline is not close either
    assert close([0.78, 0.84, 0.9]).replayed is False
    # the same +0.1 mean with seeds ±1 apart: the interval [-2.27, +2.47] reaches past ±1
    wide = [1.1, 3.1, 2.4]  # -0.9, +1.0, +0.2
    f = close(wide)
    assert ci(wide, BASE) == "95% CI [-2.27, +2.47]"
    assert (
        f.replayed is None and "undecided: the interval reaches across the margin ±1" in f.evidence
    )


def test_warmup_an_arm_at_chance_or_a_diverged_run_makes_its_claims_invalid():
    # no warmup at chance (mean 88%, 10 classes): the claims that compare it are invalid, the
    # one that does not (gradual against the baseline) is decided
    at_chance = [87.0, 88.0, 89.0]
    df = warmup_df(BASE, at_chance, CONSTANT, GRADUAL)
    fs = warmup.findings(df, metrics=constant_curves(df, peak=1.5))
    assert invalid_by(fs[:2], "its mean error 88.0% is within 5 points of chance (90%)"), [
        f.evidence for f in fs
    ]
    assert all("did not train" in f.evidence for f in fs[:2])
    assert fs[2].replayed is True and not fs[2].invalid and "did not train" not in fs[2].evidence
    # a diverged gradual-warmup run (no finite error): every claim reads gradual
    fs = warmup.findings(warmup_df(BASE, NONE, CONSTANT, [2.1, math.nan, 2.3]), metrics={})
    assert invalid_by(fs, "1 of its 3 runs diverged"), [f.evidence for f in fs]


def test_warmup_at_smoke_scale_every_finding_is_invalid_never_replayed():
    # the case: one seed, errors 86-91% on 10 classes; "constant is the worst" is no evidence
    df = warmup_df([90.2], [86.0], [91.0], [88.0], large_k=8, steps=(250, 32))
    fs = warmup.findings(df, metrics={})
    assert invalid_by(fs, "its mean error"), [f.evidence for f in fs]
    assert all("within 5 points of chance (90%)" in f.evidence for f in fs)
    # one seed but a run that learned: undecided, one run per arm gives no interval
    fs = warmup.findings(warmup_df([20.0], [40.0], [50.0], [30.0], large_k=8), metrics={})
    assert undecided_by(fs, "one run per arm: no interval to judge the difference by"), [
        f.evidence for f in fs
    ]
    assert all(f.p is None for f in fs)


def test_warmup_findings_carry_a_budget_of_their_arms_steps_from_total_steps():
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL, steps=(4321, 271))
    curves = paired_curves(
        df,
        {"gradual": [1.1] * 3, "none": [1.5, 1.6, 1.7]},
        {"gradual": [1.02] * 3, "none": [1.2] * 3},
    )
    fs = warmup.findings(df, metrics={}) + warmup.curve_findings(df, metrics=curves)
    # k = 16 is 4k: Goyal's 90 epochs of ImageNet-1k at 4096 take ceil(90 · 1,281,167 / 4096)
    budget = Budget({"k=1": 4321, "k=16": 271}, None, "Goyal's 4k run: 28,151")
    assert [f.budget for f in fs] == [budget] * 5
    assert not any(f.budget_bound for f in fs)  # S_min is the session's to add
    # at k = 32, 8k: Goyal's run of Table 1
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL, large_k=32, steps=(5000, 156))
    (f, *_) = warmup.findings(df, metrics={})
    assert f.budget == Budget({"k=1": 5000, "k=32": 156}, None, "Goyal's 8k run: 14,076")


def flat_then(early, late, steps, epochs=4.0, until=1.0):
    """Training records of ``steps`` steps over ``epochs``: loss ``early`` up to epoch ``until``,
    then ``late``."""
    epoch = [(i + 1) * epochs / steps for i in range(steps)]
    loss = [early if e <= until else late for e in epoch]
    return pd.DataFrame({"kind": "train", "epoch": epoch, "loss": loss, "lr": 0.1})


def test_loss_gap_is_the_mean_relative_gap_of_the_binned_curves_over_the_window():
    small = flat_then(1.0, 1.0, steps=160)  # 40 steps an epoch
    large = flat_then(2.0, 1.1, steps=16)  # 4 steps an epoch: half of the 32 bins hold none
    assert warmup.loss_gap_pct(small, large, 0.0, 1.0) == pytest.approx(100.0)
    assert warmup.loss_gap_pct(small, large, 2.0, 4.0) == pytest.approx(10.0)
    # over epochs 0-2: bins (0.25, 0.5], …, (1.75, 2.0] hold a large step; 4 of the 8 at 100%
    assert warmup.loss_gap_pct(small, large, 0.0, 2.0) == pytest.approx((4 * 100 + 4 * 10) / 8)
    below = flat_then(0.5, 0.5, steps=16)
    assert warmup.loss_gap_pct(small, below, 2.0, 4.0) == pytest.approx(-50.0)
    assert math.isnan(warmup.loss_gap_pct(small, large, 1.01, 1.1))  # no whole bin inside


def paired_curves(df, early, late):
    """Baseline runs at loss 1.0; the large minibatch's run of warmup w and seed s at
    ``early[w][s]`` up to epoch 2 (the early window of a run without warmup epochs: 0-2) and
    ``late[w][s]`` after (constant: as gradual)."""
    out = {}
    for _, r in df.iterrows():
        w, s = r["warmup"], int(r["seed"])
        if r["k"] == df["k"].min():
            out[r["run_dir"]] = flat_then(1.0, 1.0, steps=400)
        else:
            w = "gradual" if w == "constant" else w
            out[r["run_dir"]] = flat_then(early[w][s], late[w][s], steps=40, until=2.0)
    return out


def test_warmup_curve_findings_replayed_not_replayed_and_undecided():
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL)
    match = {"gradual": [1.02, 1.03, 1.04], "none": [1.2, 1.2, 1.2]}  # late: +2, +3, +4%
    lag = {"gradual": [1.1, 1.1, 1.1], "none": [1.5, 1.6, 1.7]}  # early: +50, +60, +70%
    curves = paired_curves(df, lag, match)
    g = warmup.curve_gaps(df, metrics=curves)
    assert g["gradual"]["late"] == pytest.approx([2.0, 3.0, 4.0])
    assert g["none"]["early"] == pytest.approx([50.0, 60.0, 70.0])
    assert g["gradual"]["early"] == pytest.approx([10.0, 10.0, 10.0])
    fs = warmup.curve_findings(df, metrics=curves)
    assert verdicts(fs) == [True, True]
    # matches: the late gap's interval, [+0.52, +5.48], wholly inside ±10%
    assert ci(g["gradual"]["late"], [0.0] * 3) == "95% CI [+0.52, +5.48]"
    assert fs[0].evidence.startswith(
        "gap +3.0% over the second half (mean of 3; no warmup +20.0%; paper Figs. 2c and 4: "
        "the curves match closely after the warmup); Δ +3.00 % of the loss, 95% CI [+0.52, "
        "+5.48] (paired t, n = 3)"
    )
    # lags: no warmup's early gap minus gradual warmup's, [+40, +50, +60]: wholly above 0
    assert fs[1].evidence.startswith(
        "gap to the small minibatch over epochs 0-2, after the warmup: no warmup +60.0%, gradual "
        "warmup "
        "+10.0% (mean of 3; paper Fig. 2a: without warmup the training error is higher early); "
        f"Δ +50.00 % of the loss, {ci(g['none']['early'], g['gradual']['early'])} (paired t, n = 3)"
    )
    # gradual 30-32% above over the second half: wholly outside ±10%; no warmup 18-20% below
    # the small minibatch early while gradual warmup is 10% above: wholly below 0
    apart = {"gradual": [1.30, 1.31, 1.32], "none": [1.2, 1.2, 1.2]}
    ahead = {"gradual": [1.1, 1.1, 1.1], "none": [0.80, 0.81, 0.82]}
    fs = warmup.curve_findings(df, metrics=paired_curves(df, ahead, apart))
    assert verdicts(fs) == [False, False]
    assert all(f.p_against < 0.05 for f in fs)
    # the per-seed gaps scatter more than their distance from the margin or the threshold:
    # gradual late -10, +10, +40%; early, no warmup minus gradual -20, -10, 0
    noisy = {"gradual": [0.9, 1.1, 1.4], "none": [0.7, 1.0, 1.4]}
    fs = warmup.curve_findings(df, metrics=paired_curves(df, noisy, noisy))
    assert undecided_by(fs[:1], "the interval reaches across the margin ±10"), fs[0].evidence
    assert undecided_by(fs[1:], "the interval reaches across the threshold +0"), fs[1].evidence
    one = warmup_df([2.0], [6.0], [9.0], [3.0])
    fs = warmup.curve_findings(one, metrics=paired_curves(one, lag, match))
    assert undecided_by(fs, "one run per arm"), [f.evidence for f in fs]


def test_warmup_early_lag_reads_the_epochs_after_the_warmup_not_the_warmup_itself():
    """Gradual warmup 50% above the small minibatch during its warmup (0.5 epochs: its lower lr by
    design) and level with no warmup after: over epochs 0.5-2.5 neither lags."""
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL, warmup_epochs=0.5)
    curves = {}
    for _, r in df.iterrows():
        big, gradual = r["k"] > 1, r["warmup"] != "none"
        curves[r["run_dir"]] = flat_then(
            1.5 if big and gradual else 1.2 if big else 1.0,
            1.2 if big else 1.0,
            steps=400,
            until=0.5,
        )
    assert warmup.early_window(df) == (0.5, 2.0)
    g = warmup.curve_gaps(df, metrics=curves)
    assert g["gradual"]["early"] == pytest.approx([20.0] * 3)
    assert g["none"]["early"] == pytest.approx([20.0] * 3)
    f = warmup.curve_findings(df, metrics=curves)[1]
    assert "over epochs 0.5-2, after the warmup" in f.claim


def test_warmup_early_window_prints_the_bins_the_gaps_read_not_the_nominal_epochs():
    """fashion-long: 8 epochs in 32 bins of 0.25, the warmup 0.45 epochs: the gaps read the bins of
    0.5-2.25 inside 0.45-2.45, and the claim names those; at 4.0064 epochs (cpu's k = 16) the
    bins are 0.1252 wide and start at 0.5008."""
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL, warmup_epochs=0.45).assign(epochs=8.0)
    assert warmup.early_window(df) == pytest.approx((0.5, 2.25))
    small = flat_then(1.0, 1.0, steps=320, epochs=8.0)
    large = flat_then(1.0, 1.0, steps=320, epochs=8.0)
    large["loss"] = [1.0 + (e // 0.25) / 10 for e in large["epoch"]]  # a new gap in every bin
    assert warmup.loss_gap_pct(small, large, *warmup.early_window(df)) == pytest.approx(
        warmup.loss_gap_pct(small, large, 0.45, 2.45)
    )
    curves = {d: flat_then(1.0, 1.0, steps=320, epochs=8.0) for d in df["run_dir"]}
    f = warmup.curve_findings(df, metrics=curves)[1]
    assert "over epochs 0.5-2.25, after the warmup" in f.claim and "0.45" not in f.claim
    cpu = df.assign(epochs=[4.0 if k == 1 else 4.0064 for k in df["k"]], warmup_epochs=0.5)
    assert warmup.early_window(cpu) == pytest.approx((4 * 0.1252, 16 * 0.1252))


def test_warmup_late_match_says_when_its_margin_alone_admits_no_warmup():
    """No warmup's late gap inside ±10% (fashion-long: +6.8%) passes the margin too: the evidence
    says the claim rests on the paired comparison; at +20% it need not."""
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL)
    early = {"gradual": [1.1, 1.1, 1.1], "none": [1.5, 1.6, 1.7]}
    late = {"gradual": [1.02, 1.03, 1.04], "none": [1.06, 1.07, 1.08]}
    f = warmup.curve_findings(df, metrics=paired_curves(df, early, late))[0]
    assert "no warmup +7.0%" in f.evidence
    assert (
        "no warmup's gap also lies inside ±10%, so the margin alone does not tell the arms apart: "
        "the claim rests on gradual warmup lying closer (the second interval)" in f.evidence
    )
    late["none"] = [1.2, 1.2, 1.2]
    f = warmup.curve_findings(df, metrics=paired_curves(df, early, late))[0]
    assert "margin alone" not in f.evidence


def test_warmup_late_match_fails_where_no_warmup_matches_as_closely():
    """The match claim holds gradual warmup's late gap inside ±10% and below no warmup's: a
    no-warmup run as close to the small minibatch as the gradual one leaves it undecided, one
    closer makes it not replayed."""
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL)
    early = {"gradual": [1.1, 1.1, 1.1], "none": [1.5, 1.6, 1.7]}
    late = {"gradual": [1.02, 1.03, 1.04], "none": [1.0, 1.01, 1.02]}  # none 2 points closer
    f = warmup.curve_findings(df, metrics=paired_curves(df, early, late))[0]
    assert f.replayed is False and f.p_against < 0.05
    assert "lies closer to it than without warmup" in f.claim


def test_warmup_early_lag_compares_no_warmup_with_gradual_warmup_not_with_zero():
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL)
    late = {"gradual": [1.02, 1.03, 1.04], "none": [1.2, 1.2, 1.2]}

    def lag(early):
        curves = paired_curves(df, early, late)
        return warmup.curve_gaps(df, metrics=curves), warmup.curve_findings(df, metrics=curves)[1]

    # no warmup 20-22% above the small minibatch early, at every seed (against zero the claim
    # would replay), but gradual warmup 50% above: no warmup does not lag gradual
    g, f = lag({"gradual": [1.5, 1.5, 1.5], "none": [1.2, 1.21, 1.22]})
    assert all(v > 0 for v in g["none"]["early"])
    assert f.replayed is False
    assert "no warmup +21.0%, gradual warmup +50.0%" in f.evidence
    assert f"Δ -29.00 % of the loss, {ci(g['none']['early'], g['gradual']['early'])}" in f.evidence
    # no warmup 3-5% below the small minibatch early, at every seed (against zero the claim
    # would not replay), but gradual warmup 20% below: no warmup lags gradual
    g, f = lag({"gradual": [0.8, 0.8, 0.8], "none": [0.95, 0.96, 0.97]})
    assert all(v < 0 for v in g["none"]["early"])
    assert f.replayed is True
    assert f"Δ +16.00 % of the loss, {ci(g['none']['early'], g['gradual']['early'])}" in f.evidence


def test_warmup_table_puts_table_1_beside_the_baseline_and_the_large_k():
    df = warmup_df([2.0, 2.1, 2.2], [6.0, 6.1, 6.2], [9.0, 9.1, 9.2], [3.0, 3.1, 3.2])
    t = warmup.table(df).set_index(["k", "warmup"])
    assert t.loc[(1, "none"), "paper_top1_error_pct"] == 23.60
    assert t.loc[(1, "none"), "paper_batch"] == 256
    paper = {w: t.loc[(16, w), "paper_top1_error_pct"] for w in ("none", "constant", "gradual")}
    assert paper == {"none": 24.84, "constant": 25.88, "gradual": 23.74}
    assert t.loc[(16, "constant"), "final_top1_error_pct_mean"] == pytest.approx(9.1)
    assert (t["runs"] == 3).all()
    # one rule maps k to the paper's batch (k · 256): k = 16 is 4k, beside Table 1's 8k row
    assert t.loc[(16, "gradual"), "k_as_paper_batch"] == 4096
    assert t.loc[(16, "gradual"), "paper_batch"] == 8192
    assert t.loc[(1, "none"), "k_as_paper_batch"] == 256


def test_warmup_above_baseline_puts_each_arm_over_its_own_baseline_for_us_and_goyal():
    # baseline 2.1, none 6.1, constant 9.1, gradual 3.1 (means); Table 1: 23.60, 24.84, 25.88, 23.74
    df = warmup_df([2.0, 2.1, 2.2], [6.0, 6.1, 6.2], [9.0, 9.1, 9.2], [3.0, 3.1, 3.2])
    gap = warmup.above_baseline(warmup.table(df)).set_index("warmup")
    assert list(gap.index) == list(warmup.WARMUPS)
    assert gap["ours"].to_dict() == pytest.approx({"none": 4.0, "constant": 7.0, "gradual": 1.0})
    assert gap["paper"].to_dict() == pytest.approx(
        {"none": 1.24, "constant": 2.28, "gradual": 0.14}
    )
    assert gap["ours_std"].to_numpy() == pytest.approx([0.1, 0.1, 0.1])


# -- 3. batch_scaling --------------------------------------------------------------------------


def scaling_df(errors):
    """errors: k -> per-seed errors; the steps of a 20,000-image epoch × 4 at each k."""
    return frame([r for k, e in errors.items() for r in arms(e, k=k, total_steps=int(5000 / k))])


def test_batch_scaling_runs_every_seed_up_to_the_large_k_then_the_first():
    runs = batch_scaling.runs(CPU, [0, 1, 2])
    seeds = {}
    for r in runs:
        seeds.setdefault(r["batch_size"] // REF, []).append(r["seed"])
    assert seeds == {
        1: [0, 1, 2],
        2: [0, 1, 2],
        4: [0, 1, 2],
        8: [0, 1, 2],
        16: [0, 1, 2],
        32: [0],
        64: [0],
        128: [0],
        256: [0],
    }
    assert len(runs) == 19
    smoke = batch_scaling.runs(SMOKE, list(SMOKE.seeds))
    assert [(r["batch_size"], r["seed"]) for r in smoke] == [(16, 0), (64, 0), (256, 0)]


# Flat to k = 16 (each k's per-seed gaps to k = 1 tight: +0.2 to +0.25, +0.5 to +0.6), then
# k = 64's lone run 37 points up.
FLAT = {1: [3.0, 3.1, 3.2], 4: [3.25, 3.3, 3.4], 16: [3.5, 3.7, 3.7], 64: [40.0]}


def test_batch_scaling_replayed_flat_to_the_large_k_then_rising():
    fs = batch_scaling.findings(scaling_df(FLAT), large_k=16)
    assert verdicts(fs) == [True, True]
    assert fs[0].claim == (
        "the error is flat (each k within ±1 point of the baseline) from k=1 to k=16 (4k by k · 256)"
    )
    # flat: every k's paired interval against k = 1 inside ±1
    assert fs[0].evidence.startswith(
        "largest gap +0.5 points, at k=16 (paper: flat from 128 to 8k, spread 0.3; 16k +1.19); "
        f"Δ +0.22 points, {ci(FLAT[4], FLAT[1])} (paired t, n = 3)"
    )
    assert f" and Δ +0.53 points, {ci(FLAT[16], FLAT[1])} (paired t, n = 3)" in fs[0].evidence
    # rises: the lone run at k = 64 carries no test: measured, its gap beside +2
    assert fs[1].outcome == "measured" and fs[1].p is None
    assert fs[1].evidence.startswith(
        "k=64: 40.0% vs k=1: 3.1% (paper 64k: 33.96 vs 23.60); Δ +36.90 points, one run against "
        "the mean of 3 (measured, no test; the claim: above +2)"
    )
    assert "CI" not in fs[1].evidence


def test_batch_scaling_not_replayed_names_where_the_flat_region_ends():
    d = {
        1: [3.0, 3.1, 3.2],
        4: [2.5, 2.65, 2.7],
        8: [3.5, 3.55, 3.7],
        16: [8.0, 8.2, 8.1],
        64: [3.5],
    }
    fs = batch_scaling.findings(scaling_df(d), large_k=16)
    assert verdicts(fs) == [False, False]
    # k = 4 and k = 8 lie inside ±1, k = 16 wholly outside: one k outside is enough
    assert f"{ci(d[16], d[1])} (paired t, n = 3)" in fs[0].evidence
    assert (
        "not replayed at this scale: the means stay within 1 point of the baseline up to k=8 "
        "(625 steps); k=16 (312 steps) is +5.0 points from it" in fs[0].evidence
    )
    # k = 64 only 0.4 above, one run: measured below +2
    assert fs[1].outcome == "measured"
    assert "Δ +0.40 points, one run against the mean of 3 (measured, no test" in fs[1].evidence


def test_batch_scaling_undecided_when_the_intervals_reach_across_the_thresholds():
    # flat: k=16 - k=1 per seed +1.5, +2.5, +3.5, its interval [+0.02, +4.98] neither inside nor
    # outside ±1; rise: 5.5 against 2, 3, 4, whose pooled interval [-2.47, +7.47] would reach
    # across +2: a lone run decides no test, its gap +2.5 is measured above +2
    d = {1: [2.0, 3.0, 4.0], 16: [3.5, 5.5, 7.5], 64: [5.5]}
    fs = batch_scaling.findings(scaling_df(d), large_k=16)
    assert verdicts(fs) == [None, True]
    assert ci(d[16], d[1]) == "95% CI [+0.02, +4.98]" and ci(d[16], d[1]) in fs[0].evidence
    assert fs[1].outcome == "measured" and "Δ +2.50 points, one run" in fs[1].evidence
    assert undecided_by(fs[:1], "the interval reaches across the margin ±1"), fs[0].evidence
    assert (
        "; at this scale: the means stay within 1 point of the baseline up to k=1" in fs[0].evidence
    )


def test_batch_scaling_at_smoke_scale_is_invalid():
    df = scaling_df({1: [88.0], 4: [89.5], 16: [90.4]})
    fs = batch_scaling.findings(df, large_k=SMOKE.large_k)
    assert invalid_by(fs, "its mean error"), [f.evidence for f in fs]
    assert "at this scale" not in fs[0].evidence  # nothing to explain when nothing learned


def test_batch_scaling_an_arm_at_chance_makes_flat_and_rises_invalid():
    # k = 16 at chance: "flat" compares it with the baseline, invalid
    d = {1: [3.0, 3.1, 3.2], 4: [3.25, 3.3, 3.4], 16: [87.0, 88.0, 89.0], 64: [89.0]}
    flat, rises = batch_scaling.findings(scaling_df(d), large_k=16)
    assert invalid_by([flat], "its mean error 88.0% is within 5 points of chance (90%)")
    assert "did not train" in flat.evidence
    # the largest k ending at chance (the cpu profile's k=256: 89% after 20 steps) did not train:
    # Goyal's rise is of runs that trained (64k: 34%)
    assert invalid_by([rises], "its mean error 89.0% is within 5 points of chance (90%)")
    d = {**d, 64: [60.0]}  # trained, and well above the baseline
    rises = batch_scaling.findings(scaling_df(d), large_k=16)[1]
    assert rises.replayed is True and rises.outcome == "measured"
    # the baseline at chance: nothing rises or stays flat against it
    d = {**FLAT, 1: [87.0, 88.0, 89.0]}
    fs = batch_scaling.findings(scaling_df(d), large_k=16)
    assert invalid_by(fs, "its mean error 88.0% is within 5 points of chance (90%)")


def test_batch_scaling_findings_carry_the_steps_of_their_arms():
    # scaling_df: 5000 / k steps at each k (total_steps)
    flat, rises = batch_scaling.findings(scaling_df(FLAT), large_k=16)
    assert flat.budget == Budget(
        {"k=1": 5000, "k=4": 1250, "k=16": 312}, None, "Goyal's 4k run: 28,151"
    )
    # k = 64 is 16k: ceil(90 · 1,281,167 / 16384) steps in Goyal's recipe
    assert rises.budget == Budget({"k=1": 5000, "k=64": 78}, None, "Goyal's 16k run: 7,038")
    df = scaling_df(FLAT).assign(total_steps=lambda d: (d["k"] * 10).astype(int))
    assert batch_scaling.findings(df, large_k=16)[1].budget.steps == {"k=1": 10, "k=64": 640}


def test_batch_scaling_table_maps_figure_1_by_k_and_keeps_its_rows_we_did_not_run():
    df = scaling_df({1: [3.0, 3.1, 3.2], 32: [7.0], 256: [88.0]})
    t = batch_scaling.table(df).set_index("k")
    assert t.loc[32, "paper_top1_error_pct"] == 23.74 and t.loc[32, "paper_batch"] == 8192
    assert t.loc[256, "paper_top1_error_pct"] == 33.96 and t.loc[256, "batch_size"] == 4096
    assert t.loc[1, "runs"] == 3 and t.loc[1, "paper_top1_error_pct"] == 23.60
    assert pd.isna(t.loc[0.5, "batch_size"]) and t.loc[0.5, "paper_batch"] == 128
    assert list(t.index) == sorted(t.index)


# -- 4. lr_scaling_rule ------------------------------------------------------------------------


def rules_df(linear, sqrt, none, k=16):
    rows = [
        r
        for rule, e in (("linear", linear), ("sqrt", sqrt), ("none", none))
        for r in arms(e, k=k, lr_scaling=rule)
    ]
    return frame(rows).assign(
        lr=lambda d: d["lr_scaling"].map({"linear": 0.2, "sqrt": 0.05, "none": 0.0125})
    )


def test_lr_scaling_rule_runs_each_rule_with_the_same_seeds_and_its_linear_runs_are_warmups():
    runs = lr_scaling_rule.runs(CPU, [0, 1, 2])
    assert [(r["lr_scaling"], r["seed"]) for r in runs] == [
        (rule, s) for rule in ("linear", "sqrt", "none") for s in (0, 1, 2)
    ]
    assert {r["batch_size"] for r in runs} == {256}
    assert len(lr_scaling_rule.runs(SMOKE, list(SMOKE.seeds))) == 3
    # the linear-rule runs are the gradual-warmup runs of study 2 (copied, not trained again)
    gradual = [
        r
        for r in warmup.runs(CPU, [0, 1, 2])
        if r["batch_size"] == 256 and r["warmup"] == "gradual"
    ]
    assert [experiment(r, "lr_scaling_rule") for r in runs[:3]] == [
        experiment(r, "warmup") for r in gradual
    ]


def test_lr_scaling_rule_replayed_linear_best_and_none_collapsing():
    linear, sqrt, none = [4.0, 4.5, 5.0], [39.0, 40.5, 41.0], [79.0, 80.0, 81.5]
    fs = lr_scaling_rule.findings(rules_df(linear, sqrt, none))
    assert verdicts(fs) == [True, True]
    assert "(mean of 3; linear best in 3 of 3 seeds); paper 23.74, 26.22, 41.67" in fs[0].evidence
    # linear best: below sqrt and below none, both paired intervals wholly above 0
    assert f"{ci(sqrt, linear)} (paired t, n = 3)" in fs[0].evidence
    assert f"{ci(none, linear)} (paired t, n = 3)" in fs[0].evidence
    # collapse: none - linear [75, 75.5, 76.5], its interval wholly above +5
    assert fs[1].evidence.startswith(
        "none 80.2% vs linear 4.5% (+75.7 points, mean of 3); paper 41.67 vs 23.74 (+17.9); "
        f"Δ +75.67 points, {ci(none, linear)} (paired t, n = 3)"
    )
    # both at the large k: its steps (frame's 100) beside Goyal's run at k = 16, 4k
    assert [f.budget for f in fs] == [Budget({"k=16": 100}, None, "Goyal's 4k run: 28,151")] * 2


def test_lr_scaling_rule_not_replayed():
    # sqrt 5 points below linear; none only 2 above it, its interval wholly below +5
    fs = lr_scaling_rule.findings(rules_df([10.0, 10.1, 10.2], [5.0, 5.2, 5.1], [12.0, 12.1, 12.4]))
    assert verdicts(fs) == [False, False]
    assert all(f.p_against < 0.05 for f in fs)
    assert "linear best in 0 of 3 seeds" in fs[0].evidence


def test_lr_scaling_rule_undecided_when_the_intervals_reach_across_their_thresholds():
    # linear - sqrt per seed -5, +1, +1 and none - linear +12, +2, +4 (mean 6, over 5): the
    # means lean the claims' way, the intervals reach across 0 and +5
    linear, sqrt, none = [4.0, 6.0, 8.0], [9.0, 5.0, 7.0], [16.0, 8.0, 12.0]
    fs = lr_scaling_rule.findings(rules_df(linear, sqrt, none))
    assert verdicts(fs) == [None, None]
    assert undecided_by(fs[:1], "the interval reaches across the threshold +0"), fs[0].evidence
    assert undecided_by(fs[1:], "the interval reaches across the threshold +5"), fs[1].evidence
    low, high = sps.ttest_rel(none, linear).confidence_interval()
    assert low < 5 < high and ci(none, linear) in fs[1].evidence


def test_lr_scaling_rule_a_diverged_run_is_full_error_and_invalid_except_where_none_collapses():
    df = rules_df([4.0, 4.5, 5.0], [39.0, 40.5, 41.0], [5.0, 5.5, 6.0])
    df.loc[df["lr_scaling"] == "none", "status"] = "diverged"  # last evaluations were fine
    fs = lr_scaling_rule.findings(df)
    # "linear is the best": none did not train, so beating it says nothing
    assert invalid_by(fs[:1], "3 of its 3 runs diverged"), fs[0].evidence
    # "none collapses" is about that very failure (may_fail): none at 100%, 95.5 above linear
    assert fs[1].replayed is True and not fs[1].invalid
    assert "none 100.0% vs linear 4.5% (+95.5 points" in fs[1].evidence
    t = lr_scaling_rule.table(df).set_index("lr_scaling")
    assert t.loc["none", "diverged"] == 3 and t.loc["none", "final_top1_error_pct_mean"] == 100
    # none at chance without diverging: the same
    fs = lr_scaling_rule.findings(rules_df([4.0, 4.5, 5.0], [39.0, 40.5, 41.0], [89.0, 89.5, 90.5]))
    assert invalid_by(fs[:1], "its mean error 89.7% is within 5 points of chance (90%)")
    assert fs[1].replayed is True and not fs[1].invalid
    # ...but the collapse claim still needs linear to have trained
    fs = lr_scaling_rule.findings(
        rules_df([88.0, 88.5, 89.0], [40.0, 40.5, 41.0], [89.5, 90, 90.5])
    )
    assert invalid_by(fs, "its mean error 88.5% is within 5 points of chance (90%)")


def test_lr_scaling_rule_at_smoke_scale_is_invalid():
    fs = lr_scaling_rule.findings(rules_df([88.0], [89.0], [90.5], k=8))
    assert invalid_by(fs, "its mean error"), [f.evidence for f in fs]
    assert all("did not train" in f.evidence for f in fs)


def test_lr_scaling_rule_table_puts_table_2a_rule_rows_in_order():
    t = lr_scaling_rule.table(rules_df([4.0, 4.5, 5.0], [39.0, 40.0, 41.0], [79.0, 80.0, 81.0]))
    assert list(t["lr_scaling"]) == ["linear", "sqrt", "none"]
    assert list(t["paper_top1_error_pct"]) == [23.74, 26.22, 41.67]
    assert list(t["paper_lr"]) == [3.2, 0.566, 0.1] and list(t["paper_batch"]) == [8192] * 3
    assert list(t["final_top1_error_pct_mean"]) == pytest.approx([4.5, 40.0, 80.0])
    assert lr_scaling_rule.rule(8192, 1.6) is None  # 0.05 x 32: another base lr, not a rule


# -- 5. bn_gamma_init --------------------------------------------------------------------------


def gamma_df(base, large, probe=None, large_k=16):
    """base, large, probe: (γ=0 errors, γ=1 errors) by seed at k = 1 (no warmup), the large k and
    with the deeper probe at the large k. Every run's ``plateau_epochs`` is given: 2.0 with γ=0,
    1.0 with γ=1 (probe: 2.5 and 0.5)."""
    rows = []
    for k, warm, (e0, e1) in ((1, "none", base), (large_k, "gradual", large)):
        rows += arms(e0, k=k, warmup=warm, zero_init_residual=True, plateau_epochs=2.0)
        rows += arms(e1, k=k, warmup=warm, zero_init_residual=False, plateau_epochs=1.0)
    if probe is not None:
        rows += arms(probe[0], k=large_k, depth=14, zero_init_residual=True, plateau_epochs=2.5)
        rows += arms(probe[1], k=large_k, depth=14, zero_init_residual=False, plateau_epochs=0.5)
    return frame(rows)


def test_bn_gamma_init_runs_pair_the_seeds_and_probe_deeper_on_cpu_and_smoke_only():
    runs = bn_gamma_init.runs(CPU, [0, 1, 2])
    assert len(runs) == 14
    arms_ = {}
    for r in runs:
        key = (r["batch_size"], r["warmup"], r.get("depth"), r["zero_init_residual"])
        arms_.setdefault(key, []).append(r["seed"])
    for k, warm in ((16, "none"), (256, "gradual")):
        assert arms_[(k, warm, 8, True)] == arms_[(k, warm, 8, False)] == [0, 1, 2]
    assert arms_[(256, "gradual", 14, True)] == arms_[(256, "gradual", 14, False)] == [0]
    assert len(bn_gamma_init.runs(SMOKE, [0])) == 6
    assert len(bn_gamma_init.runs(CPU, [0, 1, 2], probe_depth=0)) == 12
    assert len(bn_gamma_init.runs(scales.get("imagenet"), [0])) == 4  # no probe on ResNet-50
    # its γ = 1 runs are study 2's baseline and gradual-warmup runs
    gamma1 = [experiment(r, "bn_gamma_init") for r in runs[:3] + runs[6:9]]
    wruns = warmup.runs(CPU, [0, 1, 2])
    assert gamma1 == [experiment(r, "warmup") for r in wruns[:3] + wruns[9:]]


def test_bn_gamma_init_plateau_is_the_epoch_of_half_the_loss_decrease():
    # 5 steps (smoothing over one): half the decrease, (2.0 + 1.0) / 2 = 1.5, first at epoch 1.5
    train = pd.DataFrame({"epoch": [0.0, 0.5, 1.0, 1.5, 2.0], "loss": [2.0, 2.0, 1.9, 1.2, 1.0]})
    assert bn_gamma_init.plateau_epochs(train) == 1.5
    assert math.isnan(bn_gamma_init.plateau_epochs(train.assign(loss=math.nan)))  # diverged
    df = frame(arms([3.0], k=1, warmup="none"))  # no plateau_epochs: read from the curves
    out = bn_gamma_init.prepare(df, metrics={"runs/0": train})
    assert out["plateau_epochs"].tolist() == [1.5] and out["arch"].tolist() == ["resnet8"]
    assert out["gamma_init"].tolist() == [1]


# γ=0 better by about 1 point at k = 1, 2 at k = 16 and 3 with the probe, every seed alike
WINS = ([2.0, 2.15, 2.2], [3.0, 3.1, 3.3]), ([4.0, 4.2, 4.1], [6.0, 6.1, 6.3])
PROBE_WINS = ([3.0, 3.2, 3.1], [6.0, 6.1, 6.3])


def test_bn_gamma_init_replayed_when_each_interval_lies_above_zero():
    fs = bn_gamma_init.findings(gamma_df(*WINS, probe=PROBE_WINS))
    assert verdicts(fs) == [True, True, True]
    (e0, e1), (l0, l1) = WINS
    # γ=1 - γ=0 per seed, paired: +1.0, +0.95, +1.1
    assert fs[0].evidence == (
        "γ=0 2.1% vs γ=1 3.1% (mean of 3; γ=0 better in 3 of 3 seeds; paper 23.60 vs 23.84); "
        f"Δ +1.02 points, {ci(e1, e0)} (paired t, n = 3), p = {fs[0].p:.3g}"
    )
    assert "at the large minibatch k=16" in fs[1].claim and "paper 23.74 vs 24.11" in fs[1].evidence
    assert f"{ci(l1, l0)} (paired t, n = 3)" in fs[1].evidence
    assert "resnet14" in fs[2].claim
    assert "γ=0 3.1% vs γ=1 6.1% (mean of 3; half the loss decrease" in fs[2].evidence
    assert f"{ci(PROBE_WINS[1], PROBE_WINS[0])} (paired t, n = 3)" in fs[2].evidence
    # the large k's claims carry the budget of the network they ran, the baseline's none
    assert fs[0].budget is None
    budget = Budget({"k=16": 100}, None, "Goyal's 4k run: 28,151")
    assert fs[1].budget == fs[2].budget == budget


def test_bn_gamma_init_a_lone_probe_seed_is_undecided_not_judged_by_another_networks_spread():
    fs = bn_gamma_init.findings(gamma_df(*WINS, probe=([3.0], [6.0])))
    assert verdicts(fs) == [True, True, None]  # 3 points apart, but one seed: no interval
    assert "(seed 0 only; half the loss decrease after 2.50 vs 0.50 epochs)" in fs[2].evidence
    assert undecided_by(fs[2:], "one run per arm: no interval to judge the difference by")
    assert "judged by" not in fs[2].evidence and fs[2].p is None


def test_bn_gamma_init_not_replayed_gives_the_plateaus():
    df = gamma_df(
        ([6.0, 6.15, 6.2], [2.0, 2.1, 2.3]),
        ([24.0, 24.2, 24.1], [4.0, 4.1, 4.3]),
        probe=([9.7, 9.8, 9.6], [2.6, 2.5, 2.8]),
    )
    fs = bn_gamma_init.findings(df)
    assert verdicts(fs) == [False, False, False]
    assert all(f.p_against < 0.05 and f.p_for == 1.0 for f in fs)
    assert (
        "not replayed at this scale: an earlier ResNet-8 probe found the order reversed"
        in fs[0].evidence
    )
    assert "half of its decrease after 2.00 epochs with γ=0 vs 1.00 with γ=1" in fs[1].evidence
    assert "half the loss decrease after 2.50 vs 0.50 epochs" in fs[2].evidence


def test_bn_gamma_init_is_decided_on_the_seeds_both_arms_ran():
    # γ=0 better in 2 of the 3 paired seeds; γ=1's extra seed 3 (no γ=0 run) is left out
    base = ([2.0, 2.1, 9.0], [3.0, 3.1, 3.2])
    df = gamma_df(base, ([4.0, 4.1, 4.2], [6.0, 6.1, 6.2]))
    extra = frame(
        [{"k": 1, "warmup": "none", "seed": 3, "final_top1_error_pct": 50.0, "plateau_epochs": 1.0}]
    ).assign(run_dir="runs/extra")
    fs = bn_gamma_init.findings(pd.concat([df, extra], ignore_index=True))
    assert "(mean of 3; γ=0 better in 2 of 3 seeds" in fs[0].evidence
    # means 4.4 vs 3.1; γ=1 - γ=0 per seed +1.0, +1.0, -5.8: the interval reaches across 0
    assert f"{ci(base[1], base[0])} (paired t, n = 3)" in fs[0].evidence
    assert undecided_by(fs[:1], "the interval reaches across the threshold +0")
    assert "at this scale: an earlier ResNet-8 probe" in fs[0].evidence


def test_bn_gamma_init_undecided_across_the_threshold_and_invalid_at_smoke_scale():
    # γ=1 - γ=0 per seed: k=1 +1, +0.5, 0; k=16 +2, -1, -4; probe +1, -2, +2.5
    df = gamma_df(
        ([2.0, 4.0, 6.0], [3.0, 4.5, 6.0]),
        ([4.0, 8.0, 12.0], [6.0, 7.0, 8.0]),
        probe=([5.0, 7.0, 4.0], [6.0, 5.0, 6.5]),
    )
    fs = bn_gamma_init.findings(df)
    assert undecided_by(fs, "the interval reaches across the threshold +0"), [
        f.evidence for f in fs
    ]
    smoke = gamma_df(([89.0], [88.0]), ([90.5], [87.0]), probe=([89.9], [88.8]), large_k=8)
    fs = bn_gamma_init.findings(smoke)
    assert invalid_by(fs, "its mean error"), [f.evidence for f in fs]
    assert all("within 5 points of chance (90%)" in f.evidence for f in fs)


def test_bn_gamma_init_table_puts_table_2b_on_the_profiles_network_first():
    df = gamma_df(
        ([2.0, 2.1, 2.2], [3.0, 3.1, 3.2]), ([4.0, 4.1, 4.2], [6.0, 6.1, 6.2]), probe=([3.0], [6.0])
    )
    t = bn_gamma_init.table(df)
    assert list(zip(t["arch"], t["k"], t["gamma_init"], strict=True)) == [
        ("resnet8", 1, 0),
        ("resnet8", 1, 1),
        ("resnet8", 16, 0),
        ("resnet8", 16, 1),
        ("resnet14", 16, 0),
        ("resnet14", 16, 1),
    ]
    assert list(t["paper_top1_error_pct"][:4]) == [23.60, 23.84, 23.74, 24.11]
    assert list(t["paper_batch"][:4]) == [256, 256, 8192, 8192]
    assert t["paper_top1_error_pct"][4:].isna().all()  # no ResNet-14 in the paper
    assert list(t["plateau_epochs_mean"]) == [2.0, 1.0, 2.0, 1.0, 2.5, 0.5]


# -- what the paper reports, beside every finding ----------------------------------------------


GOYAL_TABLE_1 = "Goyal Table 1: "


def test_every_finding_of_studies_1_to_5_carries_the_papers_numbers_and_source():
    diverged = frame(arms([90.0], k=16, status="diverged"))
    assert [f.paper for f in quickstart.findings(diverged)] == [
        f"{GOYAL_TABLE_1}the linear rule with gradual warmup at 8k trains to 23.74% error (the "
        "claim itself is lbsgd's check)"
    ]
    df = warmup_df(BASE, NONE, CONSTANT, GRADUAL)
    curves = paired_curves(
        df,
        {"gradual": [1.1] * 3, "none": [1.5, 1.6, 1.7]},
        {"gradual": [1.02] * 3, "none": [1.2] * 3},
    )
    fs = warmup.findings(df, metrics={}) + warmup.curve_findings(df, metrics=curves)
    assert [f.paper for f in fs] == [
        f"{GOYAL_TABLE_1}gradual 23.74% vs none 24.84% error (8k)",
        f"{GOYAL_TABLE_1}constant 25.88%, none 24.84%, gradual 23.74% error (8k)",
        f"{GOYAL_TABLE_1}gradual 23.74% error at 8k vs baseline 23.60% at 256",
        "Goyal Figs. 2c and 4: qualitative, with gradual warmup the 8k training curve matches "
        "the 256 one closely after the warmup; no number",
        "Goyal Fig. 2a: qualitative, without warmup the 8k training error is higher early than "
        "with gradual warmup; no number",
    ]
    # the paper's numbers in their own field; the evidence keeps ours first
    assert fs[0].evidence.startswith(f"2.2% vs 6.1% (mean of 3; paper 23.74 vs 24.84{MAPPED}); Δ")
    fs = batch_scaling.findings(scaling_df(FLAT), 16)
    assert [f.paper for f in fs] == [
        "Goyal Fig. 1: 23.48% to 23.74% error from 128 to 8k (spread 0.26 points)",
        "Goyal Fig. 1: 33.96% error at 64k vs 23.60% at 256 (24.79% at 16k, 27.55% at 32k)",
    ]
    fs = lr_scaling_rule.findings(rules_df([4.0, 4.5, 5.0], [4.0, 4.5, 5.0], [4.0, 4.5, 5.0]))
    assert [f.paper for f in fs] == [
        "Goyal Table 2a: linear 23.74%, sqrt 26.22%, none 41.67% error (8k)",
        "Goyal Table 2a: none 41.67% vs linear 23.74% error (+17.93 points, 8k)",
    ]
    fs = bn_gamma_init.findings(gamma_df(*WINS, probe=PROBE_WINS))
    assert [f.paper for f in fs] == [
        "Goyal Table 2b: γ=0 23.60% vs γ=1 23.84% error (256)",
        "Goyal Table 2b: γ=0 23.74% vs γ=1 24.11% error (8k)",
        "Goyal Table 2b (ResNet-50): γ=0 23.74% vs γ=1 24.11% error (8k)",
    ]


def test_batch_scaling_above_baseline_is_each_sides_error_over_its_k_1():
    df = scaling_df({1: [2.0, 2.2, 2.4], 16: [3.0, 3.2, 3.4], 128: [40.0]})
    gap = batch_scaling.above_baseline(batch_scaling.table(df)).set_index("k")
    assert gap.loc[1, "ours"] == 0 and gap.loc[16, "ours"] == pytest.approx(1.0)
    assert gap.loc[128, "ours"] == pytest.approx(37.8)
    # Goyal Fig. 1 over his 256 (k = 1): 8k (k = 32) +0.14, 64k (k = 256) +10.36
    assert gap.loc[32, "paper"] == pytest.approx(0.14) and gap.loc[256, "paper"] == pytest.approx(
        10.36
    )
    assert math.isnan(gap.loc[32, "ours"])  # no run of ours there


# -- study 2's pre-registered test (fashion-long) ----------------------------------------------


def test_decision_power_is_what_a_simulation_of_the_paired_interval_decides():
    """The chance that a paired 95% interval of 20 pairs lies wholly above 0 or wholly below 1.1,
    integrated exactly, equals 100,000 simulated replays (±0.5%), lowest at the midpoint."""
    import numpy as np

    from lbsgd.lab import stats

    rng = np.random.default_rng(7)
    for true in (0.55, 0.0, 1.4):
        d = rng.normal(true, 1.24, (100_000, 20))
        m, s = d.mean(axis=1), d.std(axis=1, ddof=1)
        half = sps.t.ppf(0.975, 19) * s / math.sqrt(20)
        simulated = np.mean((m - half > 0) | (m + half < 1.1))
        assert stats.decision_power(0.0, 1.1, true, 1.24, 20) == pytest.approx(simulated, abs=0.005)
    mid = stats.decision_power(0.0, 1.1, 0.55, 1.24, 20)
    assert mid < stats.decision_power(0.0, 1.1, 0.3, 1.24, 20)


def test_pairs_to_decide_is_the_first_number_of_pairs_at_80_percent():
    from lbsgd.lab import stats

    n = stats.pairs_to_decide(0.0, 1.1, 1.24)
    assert n == 18  # the number fashion-long's pre-registration cites
    assert stats.decision_power(0.0, 1.1, 0.55, 1.24, n) >= 0.8
    assert stats.decision_power(0.0, 1.1, 0.55, 1.24, n - 1) < 0.8


def test_the_preregistered_seeds_are_fresh_and_enough_for_the_planned_spread():
    """fashion-long's test: seeds no other run of the profile uses (its study seeds, the ladder's,
    the tuning search's), at least the pairs that give 80% decision power at the planned sd, two
    runs a seed at k = 32 (none and gradual), then the ladder's."""
    from lbsgd.lab import stats

    p = scales.get("fashion-long")
    t = warmup.settings(p)
    from lbsgd.lab.studies import optimizers
    from lbsgd.lab.studies import steps_to_target as stt

    used = {*p.seeds, *stt.settings(p)["seeds"], *optimizers.Grid.of(None, None, p).seeds}
    assert not used & set(t["seeds"]) and not used & set(t["ladder_seeds"])
    assert len(t["seeds"]) >= stats.pairs_to_decide(0.0, warmup.GOYAL_BENEFIT, t["sd"])
    runs = warmup.preregistered_runs(p)
    first = runs[: 2 * len(t["seeds"])]
    assert [(r["batch_size"], r["warmup"], r["seed"]) for r in first[:2]] == [
        (512, "none", 4000),
        (512, "gradual", 4000),
    ]
    assert {r["seed"] for r in first} == set(t["seeds"])
    assert {r["batch_size"] for r in runs[len(first) :]} == {1024, 2048}
    assert warmup.preregistered_runs(scales.get("fashion")) == []


@pytest.mark.parametrize(
    "shift, outcome, words",
    [
        (2.0, True, "gradual beats none"),  # interval above 1.1 too: beats, not "by less"
        (0.55, True, "by less than Goyal's 1.1"),  # a tight interval inside (0, 1.1)
        (-0.5, False, "smaller than Goyal's 1.1"),
    ],
)
def test_the_benefit_claim_has_two_decided_outcomes(shift, outcome, words):
    gradual = [15.0 + 0.1 * i for i in range(20)]
    wiggle = [0.1 * (-1) ** i for i in range(20)]
    none = [g + shift + w for g, w in zip(gradual, wiggle, strict=True)]
    v = warmup.benefit_verdict(none, gradual, planned=20)
    assert v.replayed is outcome and words in v.test
    assert v.p is not None and v.p < 0.05  # a tested claim: in the report's BH family
    if shift == 2.0:
        assert "by less" not in v.test


def test_the_benefit_claim_is_undecided_across_both_bounds_or_short_of_its_pairs():
    gradual = [15.0] * 20
    none = [15.55 + 2.0 * (-1) ** i for i in range(20)]  # sd 2: the interval covers 0 and 1.1
    v = warmup.benefit_verdict(none, gradual, planned=20)
    assert v.replayed is None and "covers both 0 and 1.1" in v.why
    assert v.p_for > 0.05 and v.p_against > 0.05
    short = warmup.benefit_verdict(none[:10], gradual[:10], planned=20)
    assert short.replayed is None and "10 of the 20 pre-registered pairs" in short.why


def test_the_ladder_gives_each_ladder_seeds_error_and_warmup_peak_by_k_and_warmup():
    p = scales.get("fashion-long")
    rows = [
        {
            "k": k,
            "batch_size": 16 * k,
            "warmup": w,
            "seed": s,
            "status": "completed",
            "final_top1_error_pct": e,
            "run_dir": f"{k}-{w}-{s}",
        }
        for k, w, s, e in [
            (64, "none", 4000, 20.0),
            (64, "gradual", 4000, 18.0),
            (64, "none", 4005, 19.0),
            (32, "none", 4001, 15.0),
        ]
    ]
    peak = {"64-none-4000": 3.0, "64-gradual-4000": 2.0, "32-none-4001": 2.2}
    curves = {d: flat_then(peak[d], 1.0, steps=40, until=0.2) for d in peak}
    for d in curves:  # the first step at 2.0, then the peak inside the 0.45-epoch window
        curves[d].loc[0, "loss"] = 2.0
    t = warmup.ladder(pd.DataFrame(rows), p, metrics=curves)
    assert list(zip(t["k"], t["warmup"], t["seed"], strict=True)) == [
        (32, "none", 4001),
        (64, "gradual", 4000),
        (64, "none", 4000),
    ]  # seed 4005 is not a ladder seed
    assert list(t["warmup_peak_over_initial"]) == pytest.approx([1.1, 1.0, 1.5])
    assert list(t["final_top1_error_pct"]) == [15.0, 18.0, 20.0]


def test_warmup_peak_is_the_windows_largest_loss_over_the_first():
    train = pd.DataFrame({"epoch": [0.1, 0.2, 0.4, 0.6], "loss": [2.0, 3.0, 1.0, 9.0]})
    assert warmup.warmup_peak(train, 0.45) == 1.5


def ladder_runs(errors):
    """fashion-long's ladder runs: (k, warmup) -> the errors of seeds 4000 and 4001."""
    return frame(
        [
            {"k": k, "warmup": w, "seed": 4000 + i, "final_top1_error_pct": e, "epochs": 8.0}
            for (k, w), es in errors.items()
            for i, e in enumerate(es)
        ]
    )


# fashion-long's committed ladder: k = 64 both arms train, 5.7 points above the baseline; at
# k = 128 both fail (no warmup at chance for one seed)
LADDER = {
    (64, "none"): [20.36, 18.88],
    (64, "gradual"): [18.54, 18.34],
    (128, "none"): [72.67, 90.0],
    (128, "gradual"): [58.21, 29.7],
}


def test_the_ladder_is_four_measured_findings_the_tests_two_claims_at_each_ladder_k():
    p = scales.get("fashion-long")
    test = ladder_runs(LADDER)
    curves = {d: flat_then(2.0, 1.0, steps=40, epochs=8.0, until=0.2) for d in test["run_dir"]}
    base = [12.5, 13.0]
    fs = warmup.ladder_findings(test, base, p, metrics=curves)
    assert [f.outcome for f in fs] == ["measured"] * 4  # two seeds: no test, no p
    assert [f.replayed for f in fs] == [True, False, True, False]
    assert all(f.p is None and not f.decided for f in fs)
    assert fs[0].claim == (
        "ladder: at k=64 (16k by k · 256) gradual warmup beats no warmup (measured: 2 seeds, no test)"
    )
    assert fs[3].claim == (
        "ladder: with gradual warmup k=128 (32k by k · 256) comes close to the baseline (within "
        "±1 point; measured: 2 seeds, no test)"
    )
    assert fs[0].evidence.startswith(
        "seeds 4000, 4001: none 20.36% (peak x1.00), 18.88% (peak x1.00); gradual 18.54% (peak "
        "x1.00), 18.34% (peak x1.00)"
    )
    assert fs[0].evidence.endswith("Δ +1.18 points (none − gradual; the claim: above 0)")
    # gradual at k = 128 averages 43.955%: 31.20 points above the baseline's 12.75%
    assert fs[3].evidence.endswith(
        "Δ +31.20 points (gradual − baseline 12.75%, mean of 2; the claim: inside ±1)"
    )
    assert "58.21%" in fs[3].evidence and "29.70%" in fs[3].evidence
    assert fs[2].budget.steps == {"k=128": 100}
    assert fs[3].paper == "Goyal Fig. 1: 27.55% at 32k vs 23.60% at 256"


def test_a_ladder_arm_with_gradual_warmup_at_chance_is_invalid_no_warmup_may_fail():
    p = scales.get("fashion-long")
    test = ladder_runs({**LADDER, (128, "gradual"): [88.0, 89.0]})
    curves = {d: flat_then(2.0, 1.0, steps=40, epochs=8.0) for d in test["run_dir"]}
    fs = warmup.ladder_findings(test, [12.5, 13.0], p, metrics=curves)
    assert [f.outcome for f in fs] == ["measured", "measured", "invalid", "invalid"]
    assert "invalid: its mean error 88.5% is within 5 points of chance" in fs[2].evidence
