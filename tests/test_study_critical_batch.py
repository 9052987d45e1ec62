"""Study 11 (lbsgd.lab.studies.critical_batch) on hand-made runs and curves: the run list of the cpu
and smoke profiles, steps to a loss target, B_simple at a step, the fit of S(B) = S_min (1 +
B_crit/B), the knee of the error, and each finding replayed, not replayed and undecided."""

import math

import numpy as np
import pandas as pd
import pytest
from helpers import run_name, verdicts

from lbsgd import config
from lbsgd.lab import stats
from lbsgd.lab.studies import batch_scaling, scales
from lbsgd.lab.studies import critical_batch as cb

CPU, SMOKE = scales.get("cpu"), scales.get("smoke")
REF = 16  # the cpu and smoke profiles' reference batch, and their B_small
S_MIN, B_CRIT = 50, 64  # the hand-made study: S(B) = 50 (1 + 64/B) steps to the target


def records(losses, b_simple=None):
    """Train records of steps 1, 2, … with these losses (and smoothed B_simple, None allowed)."""
    out = pd.DataFrame({"kind": "train", "step": range(1, len(losses) + 1), "loss": losses})
    if b_simple is not None:
        out[cb.B_NOISE] = b_simple
    return out


# -- the runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", [CPU, SMOKE], ids=["cpu", "smoke"])
def test_runs_measure_the_noise_scale_exactly_where_the_batch_exceeds_b_small(profile):
    seeds = list(profile.seeds)
    runs = cb.runs(profile, seeds)
    assert batch_scaling.small_batch(profile) == REF
    assert all(r["noise_scale"] == (r["batch_size"] > REF) for r in runs)
    assert {r["noise_scale_batch"] for r in runs if r["noise_scale"]} == {REF}
    assert any(not r["noise_scale"] for r in runs) and any(r["noise_scale"] for r in runs)
    # notebook 3's sweep: the same experiments (run names), each a valid config with its layout
    same = batch_scaling.runs(profile, seeds)
    assert [run_name(r) for r in runs] == [run_name(r) for r in same]
    for r in runs:
        assert r["eval_every"] == profile.base["eval_every"]
        cfg = config.from_dict({**r, "study": cb.STUDY})
        d = config.derive(cfg, 1, r["synthetic_train"])
        assert d.noise_batch == (REF if r["noise_scale"] else None)


def test_small_batch_is_an_integer_micro_batch_else_the_bn_batch():
    gpu = scales.get("cifar10")  # micro_batch=auto
    assert batch_scaling.small_batch(gpu) == gpu.base["bn_batch"] == 32
    fixed = scales.Profile("x", {**gpu.base, "micro_batch": 64}, (0,), {}, 1)
    assert batch_scaling.small_batch(fixed) == 64


def _experiments(runs, study):
    return [config.from_dict({**r, "study": study}).experiment_id() for r in runs]


def test_with_the_noise_scale_in_batch_scaling_study_11_is_notebook_3s_sweep_and_without_it_another():
    # fashion: notebook 3 trains study 11's runs (the same experiments, so study 11 copies them)
    fashion = scales.get("fashion")
    assert batch_scaling.NOISE_SCALE == ("fashion",)
    seeds = list(fashion.seeds)
    ours = batch_scaling.runs(fashion, seeds)
    assert ours == cb.runs(fashion, seeds) and len(ours) == 5 * 5 + 3  # k ≤ 16: 5 seeds; 32-128: 1
    assert _experiments(ours, "x") == _experiments(cb.runs(fashion, seeds), "x")
    assert [r["noise_scale"] for r in ours] == [r["batch_size"] > 16 for r in ours]
    # cpu: notebook 3 trains without the probe: the same experiments (the probe is a measurement,
    # not the mathematics), but above B_small study 11 records what notebook 3's runs did not, so
    # it trains them itself (experiments.find_identical asks for the same measurements)
    plain, probed = batch_scaling.runs(CPU, list(CPU.seeds)), cb.runs(CPU, list(CPU.seeds))
    assert _experiments(plain, "x") == _experiments(probed, "x")
    assert all("noise_scale" not in r for r in plain)
    assert [r["noise_scale"] for r in probed] == [r["batch_size"] > REF for r in plain]


# -- one run's curve ---------------------------------------------------------------------------


def test_steps_to_target_is_the_first_step_the_moving_average_reaches_it():
    rec = records([3.0, 2.0, 1.0, 1.0, 0.5])
    # window 1 step (64 samples at batch 64): the raw loss
    assert cb.steps_to_target(rec, 1.0, 64, 64) == 3
    # window 2 steps: means 3, 2.5, 1.5, 1.0, 0.75
    assert cb.steps_to_target(rec, 1.0, 128, 64) == 4
    assert cb.steps_to_target(rec, 1.5, 128, 64) == 3
    assert cb.steps_to_target(rec, 0.1, 128, 64) is None
    assert cb.window_steps(100, 256) == 1 and cb.window_steps(2000, 16) == 125


def test_steps_to_target_reads_train_records_in_step_order():
    rec = pd.concat(
        [records([3.0, 1.0]).iloc[::-1], pd.DataFrame([{"kind": "eval", "step": 1, "loss": 0.0}])]
    )
    assert cb.steps_to_target(rec, 1.0, 1, 1) == 2


def test_b_noise_at_a_step_is_the_last_positive_smoothed_value_up_to_it():
    rec = records([1.0] * 5, [None, 10.0, None, -3.0, 40.0])
    assert cb.b_noise_at(rec, 2) == 10.0
    assert cb.b_noise_at(rec, 4) == 10.0  # None and negative skipped
    assert cb.b_noise_at(rec) == 40.0
    assert math.isnan(cb.b_noise_at(rec, 1))
    assert math.isnan(cb.b_noise_at(records([1.0, 1.0])))  # noise_scale off


def test_early_is_twenty_percent_of_training_or_the_end_of_the_warmup():
    assert cb.early_step(1000, 50) == 200
    assert cb.early_step(1000, 300) == 300


# -- the hand-made study -----------------------------------------------------------------------


def steps_of(batch):
    return round(S_MIN * (1 + B_CRIT / batch))


def study(
    b_target, b_early=(20.0, 20.0, 20.0), b_end=(100.0, 100.0, 100.0), errors=None, seeds=(0, 1, 2)
):
    """k = 1, 2, 4, 8 (batch 16 … 128, k = 1 without the noise scale), each seed reaching the
    loss target 1.5 at S(B) of half its steps; B_simple ``b_early`` to the early step,
    ``b_target`` up to the end, ``b_end`` at the last step (per seed, the same at every k).
    Errors flat to k = 4, 10 points up at k = 8 (or ``errors``: k -> error)."""
    errors = errors or {1: 5.0, 2: 5.5, 4: 6.0, 8: 15.0}
    rows, curves = [], {}
    for k, err in errors.items():
        batch = int(k * REF)
        hit = steps_of(batch)
        total = 2 * hit
        early = cb.early_step(total, 0)
        for s in seeds:
            d = f"runs/k{k}s{s}"
            loss = [2.0 if i < hit else 1.0 for i in range(1, total + 1)]
            b = [b_early[s] if i <= early else b_target[s] for i in range(1, total)] + [b_end[s]]
            curves[d] = records(loss, b if batch > REF else None)
            rows.append(
                {
                    "dataset": "synthetic",
                    "status": "completed",
                    "k": float(k),
                    "batch_size": batch,
                    "seed": s,
                    "final_top1_error_pct": err + s / 10,
                    "total_steps": total,
                    "warmup_steps": 0,
                    "num_train": 20_000,
                    "run_dir": d,
                }
            )
    df = pd.DataFrame(rows)
    return cb.measure(df, large_k=8, target=1.5, window_samples=1, metrics=curves)


def test_measure_counts_the_steps_and_reads_b_simple_per_run():
    m = study(b_target=(60.0, 70.0, 80.0))
    assert list(m["steps_to_target"]) == [steps_of(int(k * REF)) for k in m["k"]]
    k2 = m[m["k"] == 2].sort_values("seed")
    assert list(k2["b_noise_target"]) == [60.0, 70.0, 80.0]
    assert list(k2["b_noise_early"]) == [20.0] * 3 and list(k2["b_noise_end"]) == [100.0] * 3
    assert list(k2["loss_early"]) == [2.0] * 3 and list(k2["loss_end"]) == [1.0] * 3
    assert m[m["k"] == 1]["b_noise_target"].isna().all()  # batch 16 = B_small: not measured
    assert cb.baseline_k(m) == 2


def test_default_target_is_the_highest_smoothed_final_loss_of_the_large_k_seeds():
    curves = {
        "a": records([3.0, 2.0, 1.0]),
        "b": records([3.0, 2.0, 2.0]),
        "c": records([0.1, 0.1, 0.1]),
    }
    df = pd.DataFrame({"k": [4.0, 4.0, 1.0], "batch_size": [64, 64, 16], "run_dir": list("abc")})
    # window 2 steps at batch 64: final means 1.5 and 2.0 (every seed reaches 2.0); k = 1 (run
    # c) is not read
    assert cb.default_target(df, 8, 128, curves) == pytest.approx(2.0)
    curves["b"] = records([3.0, 1.4, 1.2])
    assert cb.default_target(df, 8, 128, curves) == pytest.approx(1.5)  # 1.5 and 1.3
    assert cb.default_target(df, 4, 64, curves) == pytest.approx(1.2)  # window 1: 1.0 and 1.2


def test_measure_defaults_the_target_to_the_large_k_runs_final_loss():
    rec = {"a": records([3.0, 1.0]), "b": records([3.0, 2.0, 1.5, 1.2, 1.0])}
    df = pd.DataFrame(
        {
            "k": [2.0, 1.0],
            "batch_size": [32, 16],
            "run_dir": ["a", "b"],
            "total_steps": [2, 5],
            "warmup_steps": [0, 0],
            "num_train": [10, 10],
        }
    )
    m = cb.measure(df, large_k=2, metrics=rec)  # window a tenth of 10 samples: one step
    assert list(m["target_loss"]) == [1.0, 1.0] and list(m["window_samples"]) == [1, 1]
    assert list(m["steps_to_target"]) == [2, 5]


# -- the fit -----------------------------------------------------------------------------------


def test_fit_recovers_s_min_e_min_and_b_crit_from_exact_steps():
    b = np.array([16, 32, 64, 128, 256, 512])
    f = stats.fit_steps(b, 300 * (1 + 200 / b))
    assert f.s_min == pytest.approx(300) and f.b_crit == pytest.approx(200)
    assert f.e_min == pytest.approx(300 * 200) and f.rms == pytest.approx(0, abs=1e-9)
    assert f.steps(200) == pytest.approx(600)
    s, e = f.steps(b), b * f.steps(b)  # (S/S_min − 1)(E/E_min − 1) = 1
    assert (s / f.s_min - 1) * (e / f.e_min - 1) == pytest.approx(np.ones(len(b)))


def test_fit_of_noisy_steps_lands_within_ten_percent():
    rng = np.random.default_rng(0)
    b = np.array([16, 32, 64, 128, 256, 512, 1024, 2048], dtype=float)
    f = stats.fit_steps(b, 300 * (1 + 200 / b) * (1 + 0.03 * rng.standard_normal(len(b))))
    assert f.s_min == pytest.approx(300, rel=0.1) and f.b_crit == pytest.approx(200, rel=0.1)
    assert 0.01 < f.rms < 0.06


def test_fit_keeps_s_min_and_e_min_non_negative():
    b = np.array([16.0, 32.0, 64.0])
    perfect = stats.fit_steps(b, 6400 / b)  # steps halve with each doubling: no floor in range
    assert perfect.s_min == 0 and perfect.b_crit == math.inf
    assert perfect.e_min == pytest.approx(6400)
    flat = stats.fit_steps(b, [100.0, 101.0, 103.0])  # no step saved by a larger batch
    assert flat.e_min == 0 and flat.b_crit == 0 and flat.s_min == pytest.approx(101, rel=0.02)
    assert stats.fit_steps([16.0], [10.0]) is None
    assert stats.fit_steps([16.0, 32.0, 64.0], [np.nan, 10.0, np.nan]) is None


def test_fit_runs_uses_the_seed_mean_steps_of_every_k():
    f = cb.fit_runs(study(b_target=(60.0, 70.0, 80.0)))
    assert f.points == 4 and f.b_crit == pytest.approx(B_CRIT, rel=0.02)


# -- the knee ----------------------------------------------------------------------------------


def knee_of(errors):
    m = pd.DataFrame(
        [
            {"k": float(k), "batch_size": int(k * REF), "seed": 0, "final_top1_error_pct": e}
            for k, e in errors.items()
        ]
    )
    return cb.knee(m.assign(steps_to_target=1.0, b_noise_target=math.nan))


def test_knee_is_where_the_error_leaves_its_flat_region():
    assert knee_of({1: 5.0, 2: 5.5, 4: 6.0, 8: 15.0}) == (64, 128)
    # within 2 points of each other from the smallest k: 5.0 → 7.1 breaks it at k = 4
    assert knee_of({1: 5.0, 2: 6.9, 4: 7.1, 8: 7.0}) == (32, 64)
    assert knee_of({1: 5.0, 2: 9.0, 4: 9.5}) == (16, 32)
    assert knee_of({1: 5.0, 2: 5.5, 4: 6.0}) == (64, None)  # flat over the whole sweep
    assert cb.within_factor(33, 64, None) and not cb.within_factor(31, 64, None)
    assert cb.within_factor(256, 64, 128) and not cb.within_factor(257, 64, 128)


# -- the table ---------------------------------------------------------------------------------


def test_table_has_steps_b_simple_and_the_fit_per_k():
    m = study(b_target=(60.0, 70.0, 80.0))
    f = cb.fit_runs(m)
    t = cb.table(m, f).set_index("k")
    assert list(t.index) == [1, 2, 4, 8] and list(t["batch_size"]) == [16, 32, 64, 128]
    assert list(t["steps_to_target"]) == [steps_of(b) for b in (16, 32, 64, 128)]
    assert list(t["reached"]) == [3, 3, 3, 3] and list(t["runs"]) == [3, 3, 3, 3]
    assert math.isnan(t.loc[1, "b_simple_at_target"]) and t.loc[2, "b_simple_at_target"] == 70
    assert t.loc[4, "final_top1_error_pct_mean"] == pytest.approx(6.1)
    assert t["fit_steps"].to_numpy() == pytest.approx(t["steps_to_target"].to_numpy(), rel=0.02)
    (row,) = cb.fit_table(m, f).to_dict("records")
    assert row["b_crit"] == pytest.approx(B_CRIT, rel=0.02) and row["target_loss"] == 1.5
    assert (row["baseline_k"], row["baseline_batch"], row["b_noise_at_target"]) == (2, 32, 70)
    assert (row["knee_lo"], row["knee_hi"], row["fit_points"]) == (64, 128, 4)


def test_steps_to_target_of_a_k_is_nan_unless_every_seed_reached_it():
    m = study(b_target=(60.0, 70.0, 80.0))
    m.loc[(m["k"] == 8) & (m["seed"] == 1), "steps_to_target"] = math.nan
    t = cb.table(m, cb.fit_runs(m)).set_index("k")
    assert math.isnan(t.loc[8, "steps_to_target"]) and t.loc[8, "reached"] == 2
    assert cb.fit_runs(m).points == 3


# -- the findings ------------------------------------------------------------------------------


def test_every_finding_replayed_when_b_noise_sits_at_the_knee_and_b_crit_and_grows():
    fs = cb.findings(
        study(b_target=(60.0, 70.0, 80.0), b_early=(20.0, 22.0, 25.0), b_end=(100.0, 120.0, 110.0))
    )
    assert verdicts(fs) == [True, True, True], [f.evidence for f in fs]
    assert fs[0].evidence == (
        "baseline k=2 (batch 32), B_noise at the target loss 1.5: 60, 70, 80 (seeds 0, 1, 2); "
        "the error leaves its flat region (within 2 points) between batch 64 and 128; ×2 band "
        "[32, 256]"
    )
    assert "B_simple early (step 60) 20, 22, 25, at the end 100, 120, 110" in fs[1].evidence
    assert "from 2 to 1" in fs[1].evidence
    # log2 of end over early per seed: 2.32, 2.45, 2.14: paired, in log2 B, wholly above 0
    assert "Δ +2.30 in log2 B, 95% CI [+1.9" in fs[1].evidence and "paired t" in fs[1].evidence
    assert "B_crit = E_min/S_min = 64" in fs[2].evidence
    # the bands decide without a test: measured, each with its number beside its band
    assert [f.outcome for f in fs] == ["measured", "replayed", "measured"]
    assert "60, 70, 80 (seeds 0, 1, 2); ×2 band [32, 128]" in fs[2].evidence


def test_no_finding_replayed_when_b_noise_is_far_from_the_knee_and_b_crit_and_falls():
    fs = cb.findings(
        study(
            b_target=(1000.0, 1100.0, 1200.0),
            b_early=(200.0, 220.0, 250.0),
            b_end=(100.0, 120.0, 110.0),
        )
    )
    assert verdicts(fs) == [False, False, False], [f.evidence for f in fs]
    assert "not replayed at this scale: every seed's B_noise lies above the band" in fs[0].evidence
    assert "not replayed at this scale: B_simple does not grow" in fs[1].evidence
    assert "lies more than ×2 above B_crit (ratio 17.19)" in fs[2].evidence


def test_findings_undecided_when_the_seeds_disagree():
    fs = cb.findings(
        study(b_target=(70.0, 1000.0, 70.0), b_early=(20.0, 20.0, 20.0), b_end=(40.0, 10.0, 25.0))
    )
    assert verdicts(fs) == [None, None, None], [f.evidence for f in fs]
    assert fs[0].evidence.endswith("undecided: 2 of 3 seeds inside the band")
    # log2 of end over early per seed: +1, −1, +0.32: the paired interval reaches across 0
    assert "undecided: the interval reaches across the threshold +0" in fs[1].evidence
    assert "Δ +0.11 in log2 B, 95% CI [" in fs[1].evidence and "(paired t, n = 3)" in fs[1].evidence
    assert fs[2].evidence.endswith("undecided: 2 of 3 seeds inside the band")


def test_findings_invalid_at_chance_and_undecided_with_one_seed_or_without_a_measurement():
    at_chance = {1: 88.0, 2: 89.0, 4: 90.0, 8: 91.0}
    fs = cb.findings(study(b_target=(60.0, 70.0, 80.0), errors=at_chance))
    assert all("invalid: every run is at chance (90% error)" in f.evidence for f in fs)
    assert verdicts(fs) == [None, None, None] and all(f.invalid for f in fs)
    fs = cb.findings(study(b_target=(60.0,), b_early=(20.0,), b_end=(100.0,), seeds=(0,)))
    assert verdicts(fs) == [None, None, None]
    assert all("undecided: fewer than 2 seeds" in f.evidence for f in fs)
    m = study(b_target=(60.0, 70.0, 80.0))
    m["b_noise_target"] = math.nan  # runs copied from notebook 3: no gns_* fields
    fs = cb.findings(m)
    assert verdicts(fs) == [None, None, None]
    assert all(
        "undecided: no k measured B_simple at the target with every seed" in f.evidence for f in fs
    )


def test_b_crit_undecided_without_a_finite_fit():
    m = study(b_target=(60.0, 70.0, 80.0))
    f = stats.fit_steps([16.0, 32.0, 64.0], [100.0, 101.0, 103.0])  # B_crit 0
    assert "undecided: the fit has no finite B_crit" in cb.findings(m, f)[2].evidence
    few = stats.fit_steps([16.0, 32.0], [100.0, 60.0])
    assert (
        "undecided: fewer than 3 batch sizes reached the target" in cb.findings(m, few)[2].evidence
    )


def test_every_finding_carries_what_mccandlish_et_al_report_qualitatively():
    fs = cb.findings(
        study(b_target=(60.0, 70.0, 80.0), b_early=(20.0, 22.0, 25.0), b_end=(100.0, 120.0, 110.0))
    )
    assert [f.paper for f in fs] == [
        "McCandlish et al. 2018: qualitative, below B_crit ≈ B_noise a larger batch buys "
        "proportionally fewer steps, above it almost none; no number in the reference data",
        "McCandlish et al. 2018: qualitative, the noise scale grows as the loss falls; no number "
        "in the reference data",
        "McCandlish et al. 2018 eq. 2.11 and Fig. 4: qualitative, B_crit = E_min/S_min ≈ B_noise; "
        "no number in the reference data",
    ]
