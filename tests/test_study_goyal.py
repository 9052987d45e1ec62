"""Studies 1-5, Goyal et al.'s (lbsgd.studies.quickstart … bn_gamma_init), on hand-made numbers:
each finding replayed, not replayed and undecided (smoke: every run at chance), the run lists of
the cpu and smoke profiles, and the paper's numbers on the right rows of each table."""

import math

import pandas as pd
import pytest
from helpers import verdicts

from lbsgd import config
from lbsgd.studies import batch_scaling, bn_gamma_init, lr_scaling_rule, quickstart, scales, warmup

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
    return all(f.replayed is None and f"undecided: {reason}" in f.evidence for f in findings)


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
        (75.0, None, "one run, 15.0 points below chance (the claim: over 20)"),
        (88.0, None, "every run is at chance (90% error)"),
    ],  # smoke: the run ends at chance
)
def test_quickstart_learns_when_twenty_points_below_chance(err, verdict, why):
    (f,) = quickstart.findings(frame(arms([err], k=16)))
    assert f.replayed is verdict, f
    assert f.evidence.startswith(f"top-1 error {err:.1f}% vs chance 90%")
    assert why is None or f"undecided: {why}" in f.evidence


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


def warmup_df(base, none, constant, gradual, large_k=16, steps=(5000, 313)):
    rows = arms(base, k=1, warmup="none", total_steps=steps[0])
    for w, e in (("none", none), ("constant", constant), ("gradual", gradual)):
        rows += arms(e, k=large_k, warmup=w, total_steps=steps[1])
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


def test_warmup_replayed_when_every_margin_exceeds_the_seed_spread():
    df = warmup_df([2.0, 2.1, 2.2], [6.0, 6.1, 6.2], [9.0, 9.1, 9.2], [3.0, 3.1, 3.2])
    fs = warmup.findings(df, metrics={})  # the curves are read only to explain a claim not shown
    assert verdicts(fs) == [True, True, True]
    assert fs[0].evidence == "3.1% vs 6.1% (mean of 3; paper 23.74 vs 24.84)"
    assert fs[1].evidence == "constant 9.1%, none 6.1%, gradual 3.1% (paper 25.88 worst)"
    assert fs[2].evidence == "3.1% vs baseline 2.1% (paper 23.74 vs 23.60)"


def test_warmup_not_replayed_says_why_at_this_scale_from_the_curves():
    df = warmup_df([2.0, 2.1, 2.2], [4.0, 4.1, 4.2], [5.0, 5.1, 5.2], [6.0, 6.1, 6.2])
    fs = warmup.findings(df, metrics=constant_curves(df, peak=1.5))
    assert verdicts(fs) == [False, False, False]
    assert (
        "not replayed at this scale: the jump at the end of the constant warmup raises the loss "
        "(its peak after the jump is 1.50x the mean just before, mean of 3)" in fs[1].evidence
    )
    assert "constant is still worse than gradual" not in fs[1].evidence  # 5.1 < 6.1
    assert (
        "not replayed at this scale: the large minibatch gets 313 optimizer steps here (the "
        "baseline 5000" in fs[2].evidence
    )
    # a loader works as well as a mapping; a small jump "barely disturbs training"
    small = constant_curves(df, peak=1.05)
    f = warmup.findings(df, metrics=lambda d: small[d])[1]
    assert "barely disturbs training here (the loss after the jump peaks at 1.05x" in f.evidence


def test_warmup_undecided_when_the_margins_are_inside_the_seed_spread():
    df = warmup_df([2.0, 4.0, 6.0], [9.0, 3.0, 6.0], [4.0, 10.0, 7.0], [5.0, 8.0, 2.0])
    fs = warmup.findings(df, metrics={})
    assert verdicts(fs) == [None, None, None]
    assert all("inside the seed spread" in f.evidence for f in fs)
    assert "not replayed" not in " ".join(f.evidence for f in fs)


def test_warmup_at_smoke_scale_every_finding_is_undecided_never_replayed():
    # the case: one seed, errors 86-91% on 10 classes; "constant is the worst" is no evidence
    df = warmup_df([90.2], [86.0], [91.0], [88.0], large_k=8, steps=(250, 32))
    fs = warmup.findings(df, metrics={})
    assert undecided_by(fs, "every run is at chance (90% error)"), [f.evidence for f in fs]
    # one seed but a run that learned: undecided for want of a seed spread
    fs = warmup.findings(warmup_df([20.0], [40.0], [50.0], [30.0], large_k=8), metrics={})
    assert undecided_by(fs, "one seed per arm"), [f.evidence for f in fs]


def flat_then(early, late, steps, epochs=4.0):
    """Training records of ``steps`` steps over ``epochs``: loss ``early`` up to epoch 1, then
    ``late``."""
    epoch = [(i + 1) * epochs / steps for i in range(steps)]
    loss = [early if e <= 1 else late for e in epoch]
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
    ``early[w][s]`` up to epoch 1 and ``late[w][s]`` after (constant: as gradual)."""
    out = {}
    for _, r in df.iterrows():
        w, s = r["warmup"], int(r["seed"])
        if r["k"] == df["k"].min():
            out[r["run_dir"]] = flat_then(1.0, 1.0, steps=400)
        else:
            w = "gradual" if w == "constant" else w
            out[r["run_dir"]] = flat_then(early[w][s], late[w][s], steps=40)
    return out


def test_warmup_curve_findings_replayed_not_replayed_and_undecided():
    df = warmup_df([2.0, 2.1, 2.2], [6.0, 6.1, 6.2], [9.0, 9.1, 9.2], [3.0, 3.1, 3.2])
    match = {"gradual": [1.02, 1.03, 1.04], "none": [1.2, 1.2, 1.2]}  # late: +2, +3, +4%
    lag = {"gradual": [1.1, 1.1, 1.1], "none": [1.5, 1.6, 1.7]}  # early: +50, +60, +70%
    fs = warmup.curve_findings(df, metrics=paired_curves(df, lag, match))
    assert verdicts(fs) == [True, True]
    assert fs[0].evidence == (
        "gap +3.0% over the second half (mean of 3; no warmup +20.0%; paper Figs. 2c and 4: "
        "the curves match closely after the warmup)"
    )
    assert fs[1].evidence.startswith(
        "gap +60.0% over the first epoch (mean of 3; gradual warmup +10.0%"
    )
    # gradual 31% above over the second half (margin 21 > spread 1), no warmup 19% below early
    apart = {"gradual": [1.30, 1.31, 1.32], "none": [1.2, 1.2, 1.2]}
    ahead = {"gradual": [1.1, 1.1, 1.1], "none": [0.80, 0.81, 0.82]}
    assert verdicts(warmup.curve_findings(df, metrics=paired_curves(df, ahead, apart))) == [
        False,
        False,
    ]
    # the per-seed gaps scatter more than their distance from the threshold
    noisy = {"gradual": [0.9, 1.1, 1.4], "none": [0.7, 1.0, 1.4]}
    fs = warmup.curve_findings(df, metrics=paired_curves(df, noisy, noisy))
    assert undecided_by(fs, "the margin"), [f.evidence for f in fs]
    one = warmup_df([2.0], [6.0], [9.0], [3.0])
    fs = warmup.curve_findings(one, metrics=paired_curves(one, lag, match))
    assert undecided_by(fs, "one seed per arm"), [f.evidence for f in fs]


def test_warmup_table_puts_table_1_beside_the_baseline_and_the_large_k():
    df = warmup_df([2.0, 2.1, 2.2], [6.0, 6.1, 6.2], [9.0, 9.1, 9.2], [3.0, 3.1, 3.2])
    t = warmup.table(df).set_index(["k", "warmup"])
    assert t.loc[(1, "none"), "paper_top1_error_pct"] == 23.60
    assert t.loc[(1, "none"), "paper_batch"] == 256
    paper = {w: t.loc[(16, w), "paper_top1_error_pct"] for w in ("none", "constant", "gradual")}
    assert paper == {"none": 24.84, "constant": 25.88, "gradual": 23.74}
    assert t.loc[(16, "constant"), "final_top1_error_pct_mean"] == pytest.approx(9.1)
    assert (t["runs"] == 3).all()


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


def test_batch_scaling_replayed_flat_to_the_large_k_then_rising():
    df = scaling_df({1: [3.0, 3.1, 3.2], 4: [3.2, 3.3, 3.4], 16: [3.5, 3.6, 3.7], 64: [40.0]})
    fs = batch_scaling.findings(df, large_k=16)
    assert verdicts(fs) == [True, True]
    assert fs[0].claim == "the error is flat (within 2 points) from k=1 to k=16"
    assert fs[0].evidence == "spread 0.5 points (paper: flat from 128 to 8k, spread 0.3)"
    assert fs[1].evidence == "k=64: 40.0% vs k=1: 3.1% (paper 64k: 33.96 vs 23.60)"


def test_batch_scaling_not_replayed_names_where_the_flat_region_ends():
    df = scaling_df(
        {1: [3.0, 3.1, 3.2], 4: [2.0, 2.1, 2.2], 8: [3.5, 3.6, 3.7], 16: [8.0, 8.1, 8.2], 64: [3.5]}
    )
    fs = batch_scaling.findings(df, large_k=16)
    assert verdicts(fs) == [False, False]
    assert (
        "not replayed at this scale: flat within 2 points up to k=8 (625 steps); k=16 (312 "
        "steps; Goyal's 8k run: 14,076) is 6.0 points above the best, k=4" in fs[0].evidence
    )


def test_batch_scaling_undecided_inside_the_seed_spread():
    # flat: 5.5 - 3.0 = 2.5, 0.5 beyond 2, inside the spread 2.0 of k=16; rise: 5.5 - 3.0, 0.5
    # beyond 2, inside the spread 1.0 of k=1
    df = scaling_df({1: [2.0, 3.0, 4.0], 16: [3.5, 5.5, 7.5], 64: [5.5]})
    fs = batch_scaling.findings(df, large_k=16)
    assert verdicts(fs) == [None, None]
    assert all("inside the seed spread" in f.evidence for f in fs)
    assert "; at this scale: flat within 2 points up to k=1" in fs[0].evidence


def test_batch_scaling_at_smoke_scale_is_undecided():
    df = scaling_df({1: [88.0], 4: [89.5], 16: [90.4]})
    fs = batch_scaling.findings(df, large_k=SMOKE.large_k)
    assert undecided_by(fs, "every run is at chance"), [f.evidence for f in fs]
    assert "at this scale" not in fs[0].evidence  # nothing to explain when nothing learned


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
    fs = lr_scaling_rule.findings(rules_df([4.0, 4.5, 5.0], [39.0, 40.0, 41.0], [79.0, 80.0, 81.0]))
    assert verdicts(fs) == [True, True]
    assert "(mean of 3; linear best in 3 of 3 seeds); paper 23.74, 26.22, 41.67" in fs[0].evidence
    assert (
        "none 80.0% vs linear 4.5% (+75.5 points, mean of 3); paper 41.67 vs 23.74 (+17.9)"
        in fs[1].evidence
    )


def test_lr_scaling_rule_not_replayed():
    fs = lr_scaling_rule.findings(rules_df([10.0, 10.1, 10.2], [5.0, 5.1, 5.2], [12.0, 12.1, 12.2]))
    assert verdicts(fs) == [False, False]
    assert "linear best in 0 of 3 seeds" in fs[0].evidence


def test_lr_scaling_rule_undecided_inside_the_seed_spread():
    fs = lr_scaling_rule.findings(rules_df([4.0, 6.0, 8.0], [9.0, 5.0, 7.0], [14.0, 8.0, 11.0]))
    assert verdicts(fs) == [None, None]
    assert all("inside the seed spread" in f.evidence for f in fs)


def test_lr_scaling_rule_counts_a_diverged_run_as_full_error():
    df = rules_df([4.0, 4.5, 5.0], [39.0, 40.0, 41.0], [5.0, 5.5, 6.0])
    df.loc[df["lr_scaling"] == "none", "status"] = "diverged"  # last evaluations were fine
    fs = lr_scaling_rule.findings(df)
    assert verdicts(fs) == [True, True] and "none 100.0%" in fs[1].evidence
    t = lr_scaling_rule.table(df).set_index("lr_scaling")
    assert t.loc["none", "diverged"] == 3 and t.loc["none", "final_top1_error_pct_mean"] == 100


def test_lr_scaling_rule_at_smoke_scale_is_undecided():
    fs = lr_scaling_rule.findings(rules_df([88.0], [89.0], [90.5], k=8))
    assert undecided_by(fs, "every run is at chance"), [f.evidence for f in fs]


def test_lr_scaling_rule_table_puts_table_2a_rule_rows_in_order():
    t = lr_scaling_rule.table(rules_df([4.0, 4.5, 5.0], [39.0, 40.0, 41.0], [79.0, 80.0, 81.0]))
    assert list(t["lr_scaling"]) == ["linear", "sqrt", "none"]
    assert list(t["paper_top1_error_pct"]) == [23.74, 26.22, 41.67]
    assert list(t["paper_lr"]) == [3.2, 0.566, 0.1] and list(t["paper_batch"]) == [8192] * 3
    assert list(t["final_top1_error_pct_mean"]) == pytest.approx([4.5, 40.0, 80.0])
    assert lr_scaling_rule.rule(8192, 1.6) is None  # 0.05 x 32: another base lr, not a rule


# -- 5. bn_gamma_init --------------------------------------------------------------------------


def gamma_df(base, large, probe=None, large_k=16):
    """base, large: (γ=0 errors, γ=1 errors) at k = 1 (no warmup) and the large k; probe: the
    deeper pair (seed 0). Every run's ``plateau_epochs`` is given: 2.0 with γ=0, 1.0 with γ=1."""
    rows = []
    for k, warm, (e0, e1) in ((1, "none", base), (large_k, "gradual", large)):
        rows += arms(e0, k=k, warmup=warm, zero_init_residual=True, plateau_epochs=2.0)
        rows += arms(e1, k=k, warmup=warm, zero_init_residual=False, plateau_epochs=1.0)
    if probe is not None:
        rows += arms([probe[0]], k=large_k, depth=14, zero_init_residual=True, plateau_epochs=2.5)
        rows += arms([probe[1]], k=large_k, depth=14, zero_init_residual=False, plateau_epochs=0.5)
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


def test_bn_gamma_init_replayed_when_gamma0_wins_beyond_the_spread():
    df = gamma_df(
        ([2.0, 2.1, 2.2], [3.0, 3.1, 3.2]), ([4.0, 4.1, 4.2], [6.0, 6.1, 6.2]), probe=(3.0, 6.0)
    )
    fs = bn_gamma_init.findings(df)
    assert verdicts(fs) == [True, True, True]
    assert fs[0].evidence == (
        "γ=0 2.1% vs γ=1 3.1% (mean of 3; γ=0 better in 3 of 3 seeds; paper 23.60 vs 23.84)"
    )
    assert "at the large minibatch k=16" in fs[1].claim and "paper 23.74 vs 24.11" in fs[1].evidence
    assert "resnet14" in fs[2].claim
    assert "seed 0 only, judged by the seed spread of resnet8 at k=16" in fs[2].evidence


def test_bn_gamma_init_not_replayed_gives_the_plateaus():
    df = gamma_df(
        ([6.0, 6.1, 6.2], [2.0, 2.1, 2.2]), ([24.0, 24.1, 24.2], [4.0, 4.1, 4.2]), probe=(9.7, 2.6)
    )
    fs = bn_gamma_init.findings(df)
    assert verdicts(fs) == [False, False, False]
    assert (
        "not replayed at this scale: an earlier ResNet-8 probe found the order reversed"
        in fs[0].evidence
    )
    assert "half of its decrease after 2.00 epochs with γ=0 vs 1.00 with γ=1" in fs[1].evidence
    assert "half the loss decrease after 2.50 vs 0.50 epochs" in fs[2].evidence


def test_bn_gamma_init_is_decided_on_the_seeds_both_arms_ran():
    # γ=0 better in 2 of the 3 paired seeds; γ=1's extra seed 3 (no γ=0 run) is left out
    df = gamma_df(([2.0, 2.1, 9.0], [3.0, 3.1, 3.2]), ([4.0, 4.1, 4.2], [6.0, 6.1, 6.2]))
    extra = frame(
        [{"k": 1, "warmup": "none", "seed": 3, "final_top1_error_pct": 50.0, "plateau_epochs": 1.0}]
    ).assign(run_dir="runs/extra")
    fs = bn_gamma_init.findings(pd.concat([df, extra], ignore_index=True))
    assert "(mean of 3; γ=0 better in 2 of 3 seeds" in fs[0].evidence
    assert fs[0].replayed is None  # means 4.4 vs 3.1: inside the γ=0 spread (4.0)
    assert "at this scale: an earlier ResNet-8 probe" in fs[0].evidence


def test_bn_gamma_init_undecided_inside_the_seed_spread_and_at_smoke_scale():
    df = gamma_df(
        ([2.0, 4.0, 6.0], [3.0, 4.5, 6.0]), ([4.0, 8.0, 12.0], [6.0, 7.0, 8.0]), probe=(5.0, 6.0)
    )
    assert verdicts(bn_gamma_init.findings(df)) == [None, None, None]
    smoke = gamma_df(([89.0], [88.0]), ([90.5], [87.0]), probe=(89.9, 88.8), large_k=8)
    fs = bn_gamma_init.findings(smoke)
    assert undecided_by(fs, "every run is at chance"), [f.evidence for f in fs]


def test_bn_gamma_init_table_puts_table_2b_on_the_profiles_network_first():
    df = gamma_df(
        ([2.0, 2.1, 2.2], [3.0, 3.1, 3.2]), ([4.0, 4.1, 4.2], [6.0, 6.1, 6.2]), probe=(3.0, 6.0)
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
    df = warmup_df([2.0, 2.1, 2.2], [6.0, 6.1, 6.2], [9.0, 9.1, 9.2], [3.0, 3.1, 3.2])
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
        "Goyal Fig. 2a: qualitative, without warmup the 8k training error is higher than the 256 "
        "one early; no number",
    ]
    assert fs[0].evidence == "3.1% vs 6.1% (mean of 3; paper 23.74 vs 24.84)"  # kept as it was
    fs = batch_scaling.findings(
        scaling_df({1: [3.0, 3.1, 3.2], 4: [3.2, 3.3, 3.4], 16: [3.5, 3.6, 3.7], 64: [40.0]}), 16
    )
    assert [f.paper for f in fs] == [
        "Goyal Fig. 1: 23.48% to 23.74% error from 128 to 8k (spread 0.26 points)",
        "Goyal Fig. 1: 33.96% error at 64k vs 23.60% at 256 (24.79% at 16k, 27.55% at 32k)",
    ]
    fs = lr_scaling_rule.findings(rules_df([4.0, 4.5, 5.0], [4.0, 4.5, 5.0], [4.0, 4.5, 5.0]))
    assert [f.paper for f in fs] == [
        "Goyal Table 2a: linear 23.74%, sqrt 26.22%, none 41.67% error (8k)",
        "Goyal Table 2a: none 41.67% vs linear 23.74% error (+17.93 points, 8k)",
    ]
    fs = bn_gamma_init.findings(
        gamma_df(([2.0, 2.1, 2.2], [3.0, 3.1, 3.2]), ([4.0, 4.1, 4.2], [6.0, 6.1, 6.2]), (3.0, 6.0))
    )
    assert [f.paper for f in fs] == [
        "Goyal Table 2b: γ=0 23.60% vs γ=1 23.84% error (256)",
        "Goyal Table 2b: γ=0 23.74% vs γ=1 24.11% error (8k)",
        "Goyal Table 2b (ResNet-50): γ=0 23.74% vs γ=1 24.11% error (8k)",
    ]
