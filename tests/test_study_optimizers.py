"""Study 14, large-batch optimizers tuned on the same budget (lbsgd.lab.studies.optimizers), on
hand-made tables: the run lists (every trial valid, the same grid for every optimizer, the tuning
seed none of the final runs'), the choice on held-out error alone, and each finding replayed, not
replayed, undecided and invalid (an arm that did not train) by the 95% t interval of its paired
difference, the contrast of each pair one claim with three outcomes (the expected intervals
computed here with scipy)."""

import math

import numpy as np
import pandas as pd
import pytest
from helpers import verdicts
from scipy import stats as sps

from lbsgd import config
from lbsgd.config import ConfigError
from lbsgd.lab.findings import Budget
from lbsgd.lab.studies import lars, scales
from lbsgd.lab.studies import optimizers as opt

CPU, FASHION, SMOKE = scales.get("cpu"), scales.get("fashion"), scales.get("smoke")


def valid(runs):
    return [config.from_dict({**r, "study": opt.STUDY}) for r in runs]


def peak(c) -> float:
    """The run's peak lr as config.derive computes it."""
    return c.base_lr * config.lr_scale(c.lr_scaling, c.batch_size / c.reference_batch)


# -- the runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", [CPU, FASHION, SMOKE], ids=lambda p: p.name)
def test_every_optimizer_gets_the_same_grid_at_every_k(profile):
    grid = opt.Grid.of(None, None)
    cfgs = valid(opt.trials(profile, grid))
    ks = opt.ks(profile)
    assert len(ks) == 2 and len(cfgs) == grid.trials * len(opt.ARMS) * len(ks)
    assert grid.trials == 6  # 3 peak lrs x 2 warmups: the budget the notebook states
    for k in ks:
        for arm in opt.ARMS:
            mine = [
                c
                for c in cfgs
                if c.batch_size == k * c.reference_batch
                and opt.arm_of(c.optimizer, c.nesterov) == arm
            ]
            centre = opt.anchor(profile, arm, k)
            peaks = sorted({peak(c) for c in mine})
            want = sorted(centre * f for f in opt.LR_FACTORS)
            assert peaks == pytest.approx(want, rel=1e-12), (arm, k)
            assert sorted({c.warmup_epochs for c in mine}) == list(opt.WARMUPS)
            # the warmup starts at peak / k (Goyal's), whatever the optimizer's rule
            assert all(c.lr_scaling == "linear" and c.warmup == "gradual" for c in mine)
    # one schedule, one holdout, one seed that no final run uses
    assert {(c.schedule, c.holdout, c.seed) for c in cfgs} == {
        (lars.settings(profile)["schedule"], opt.settings(profile)["holdout"], opt.TUNING_SEED)
    }
    assert opt.TUNING_SEED not in profile.seeds
    assert len({c.run_name() for c in cfgs}) == len(cfgs)


def test_anchor_scales_linearly_for_momentum_and_by_square_root_for_adam():
    for arm in opt.ARMS:
        a = opt.SETTINGS["cpu"]["anchors"][arm]
        want = a * 128 if arm in ("nesterov", "lars") else a * math.sqrt(128)
        assert opt.anchor(CPU, arm, 128) == pytest.approx(want)
    # a calibrated centre at a k replaces the rule's there
    assert opt.anchor(CPU, "nesterov", 16) == 0.6 and opt.anchor(CPU, "lamb", 16) == 0.014 * 4


def test_arms_are_the_four_optimizers_with_their_own_keys():
    keys = {arm: opt.arm_keys(CPU, arm) for arm in opt.ARMS}
    assert [(k["optimizer"], k["nesterov"]) for k in keys.values()] == [
        ("sgd", True),
        ("lars", False),
        ("lamb", False),
        ("adamw", False),
    ]
    assert keys["lamb"]["weight_decay"] == keys["adamw"]["weight_decay"] == 0.01
    assert "weight_decay" not in keys["nesterov"]  # the profile's (5e-4 on cpu)


@pytest.mark.parametrize(
    "lr_factors, warmups, key",
    [([], None, "lr_factors"), ([1, -2], None, "lr_factors"), (None, [0.5, 0.5], "warmups")],
)
def test_bad_grid_is_refused_in_one_line(lr_factors, warmups, key):
    with pytest.raises(ConfigError, match=f"^{key}=") as e:
        opt.Grid.of(lr_factors, warmups)
    assert "\n" not in str(e.value)


# -- the choice --------------------------------------------------------------------------------


def trial_frame(val: dict[tuple[str, float], list[float]], profile=CPU) -> pd.DataFrame:
    """Trials as load_runs gives them: per (arm, k), the held-out errors in grid order (lr factor
    outer, warmup inner); the test error of every trial is 50 (never read by the choice)."""
    grid = opt.Grid.of(None, None)
    rows = []
    for (arm, k), errs in val.items():
        cells = [(f, w) for f in grid.lr_factors for w in grid.warmups]
        for (f, w), e in zip(cells, errs, strict=True):
            keys = opt.arm_keys(profile, arm)
            rows.append(
                {
                    "optimizer": keys["optimizer"],
                    "nesterov": keys["nesterov"],
                    "k": k,
                    "batch_size": int(k * 16),
                    "base_lr": opt.anchor(profile, arm, k) * f / k,
                    "lr": opt.anchor(profile, arm, k) * f / k * k,
                    "warmup_epochs": w,
                    "weight_decay": opt.weight_decay(profile, arm),
                    "seed": opt.TUNING_SEED,
                    "status": "completed",
                    opt.VAL: e,
                    opt.TEST: 50.0,
                    "wall_time_s": 60.0,
                    "run_dir": f"{arm}-{k}-{f}-{w}",
                    "dataset": "synthetic",
                }
            )
    return pd.DataFrame(rows)


def test_choice_is_the_least_held_out_error_and_ties_go_to_the_smaller_lr():
    df = trial_frame(
        {
            ("lars", 128.0): [30, 31, 20, 25, 40, 41],  # lr x 1, warmup 0.25
            ("lamb", 128.0): [30, 12, 35, 12, 40, 41],  # a tie: the smaller lr, x 1/3
            ("adamw", 128.0): [30, 31, 32, 33, 34, 11],  # lr x 3, warmup 1: at the grid's edge
        }
    )
    df.loc[(df["optimizer"] == "lars") & (df["warmup_epochs"] == 0.25), opt.TEST] = 1.0
    chosen = opt.choose(df).set_index("arm")
    a = opt.anchor
    assert chosen.loc["lars", "peak_lr"] == pytest.approx(a(CPU, "lars", 128))
    assert chosen.loc["lars", "warmup_epochs"] == 0.25
    assert chosen.loc["lamb", "peak_lr"] == pytest.approx(a(CPU, "lamb", 128) / 3)
    assert chosen.loc["lamb", "warmup_epochs"] == 1.0
    assert chosen.loc["adamw", "peak_lr"] == pytest.approx(a(CPU, "adamw", 128) * 3)
    assert list(chosen["lr_at_grid_edge"]) == ["", "low", "high"]
    assert list(chosen["trials"]) == [6, 6, 6]
    assert opt.TEST not in chosen.columns  # the test error of a trial is not shown


def test_two_tuning_seeds_are_chosen_by_their_mean_and_each_trial_counts():
    one = trial_frame({("lars", 128.0): [30, 31, 20, 25, 40, 41]})
    two = trial_frame({("lars", 128.0): [30, 31, 26, 25, 10, 41]})  # seed 1001
    two["seed"], two["run_dir"] = opt.TUNING_SEED + 1, two["run_dir"] + "-s1"
    chosen = opt.choose(pd.concat([one, two]))
    # means 30, 31, 23, 25, 25, 41: lr x 1 with warmup 0.25 (seed 1000 alone chose the same; seed
    # 1001 alone would choose lr x 3, warmup 0.25)
    assert chosen.loc[0, "peak_lr"] == pytest.approx(opt.anchor(CPU, "lars", 128))
    assert chosen.loc[0, opt.VAL] == 23.0
    assert (chosen.loc[0, "trials"], chosen.loc[0, "tuning_seeds"]) == (12, 2)


def test_a_profile_gives_its_own_grid_and_the_notebook_may_override_it():
    own = {"lr_factors": (0.25, 0.5, 1.0, 2.0, 4.0), "warmups": (0.25,), "seeds": (1000, 1001)}
    profile = opt.Tuned.of(CPU, {**opt.SETTINGS["cpu"], "grid": own})
    grid = opt.Grid.of(None, None, profile)
    assert (grid.lr_factors, grid.warmups, grid.seeds) == tuple(own.values())
    assert grid.trials == 5 * 1 * 2
    runs = valid(opt.trials(profile, grid))
    assert len(runs) == grid.trials * len(opt.ARMS) * len(opt.ks(profile))
    assert sorted({r.seed for r in runs}) == [1000, 1001]
    assert opt.Grid.of([1, 2, 3], None, profile).lr_factors == (1, 2, 3)
    assert opt.Grid.of(None, None, CPU) == opt.Grid()  # cpu and fashion: the study's grid


def test_a_claim_on_an_optimizer_whose_lr_sits_on_its_grid_edge_is_invalid():
    df = four(GOOD, BAD, GOOD, BAD)
    chosen = pd.DataFrame(
        [
            {"arm": a, "k": k, "lr_at_grid_edge": "high" if (a, k) == ("nesterov", 128.0) else ""}
            for a in opt.ARMS
            for k in (16.0, 128.0)
        ]
    )
    f = opt.findings(df, chosen)
    # LARS vs Nesterov (the contrast, loses less): invalid; LAMB vs AdamW: as before
    for i in (0, 2):
        assert f[i].invalid and f[i].replayed is None and f[i].p_for is None, f[i].evidence
        assert "Nesterov's chosen lr at k=128 sits on the high edge of its grid" in f[i].evidence
        assert "undecided:" not in f[i].evidence
    assert [g.outcome for g in f[1::2]] == [g.outcome for g in opt.findings(df)[1::2]]


def test_a_diverged_trial_counts_as_full_error_in_the_choice():
    df = trial_frame({("nesterov", 16.0): [30, 31, 5, 33, 34, 35]})
    df.loc[2, "status"] = "diverged"  # its last evaluation (5%) is not its result
    assert opt.choose(df).loc[0, opt.VAL] == 30


def test_finals_are_the_chosen_settings_with_the_profile_seeds():
    df = trial_frame({("lamb", 16.0): [9, 8, 7, 6, 5, 4], ("lars", 16.0): [1, 2, 3, 4, 5, 6]})
    chosen = opt.choose(df)
    finals = valid(opt.finals(CPU, chosen, CPU.seeds))
    assert sorted(c.seed for c in finals) == sorted(list(CPU.seeds) * 2)
    for c in finals:
        arm = opt.arm_of(c.optimizer, c.nesterov)
        row = chosen[chosen["arm"] == arm].iloc[0]
        assert peak(c) == row["peak_lr"]  # exactly the trial's
        assert (
            c.warmup_epochs == row["warmup_epochs"] and c.holdout == opt.SETTINGS["cpu"]["holdout"]
        )


# -- the findings ------------------------------------------------------------------------------


def final_frame(errors: dict[tuple[str, float], list[float]]) -> pd.DataFrame:
    rows = []
    for (arm, k), errs in errors.items():
        keys = opt.arm_keys(CPU, arm)
        for seed, e in enumerate(errs):
            rows.append(
                {
                    "optimizer": keys["optimizer"],
                    "nesterov": keys["nesterov"],
                    "k": k,
                    "batch_size": int(k * 16),
                    "base_lr": opt.anchor(CPU, arm, k) / k,
                    "lr": opt.anchor(CPU, arm, k) / k * k,
                    "warmup_epochs": 0.25,
                    "weight_decay": opt.weight_decay(CPU, arm),
                    "seed": seed,
                    "status": "completed",
                    opt.VAL: e,
                    opt.TEST: e,
                    "wall_time_s": 60.0,
                    "total_steps": int(4096 / k),  # k = 128: 32 steps, k = 16: 256
                    "run_dir": f"{arm}-{k}-{seed}",
                    "dataset": "synthetic",
                }
            )
    return pd.DataFrame(rows)


GOOD, BAD = [10.0, 11.0, 12.0], [20.0, 21.5, 23.0]
CHANCE = "within 5 points of chance (90%)"  # synthetic data: 10 classes


def four(lars, nesterov, lamb, adamw, small=(5.0, 5.0, 5.0, 5.0)):
    """Test errors at k = 128 per seed, and at k = 16 ``s``, ``s + 1``, ``s + 2`` per optimizer
    (``small`` in the order of opt.ARMS: Nesterov, LARS, LAMB, AdamW)."""
    errs = {(a, 128.0): e for a, e in zip(opt.ARMS, (nesterov, lars, lamb, adamw), strict=True)}
    errs |= {(a, 16.0): [s, s + 1, s + 2] for a, s in zip(opt.ARMS, small, strict=True)}
    return final_frame(errs)


def paired(x, y) -> str:
    """scipy's paired-t 95% interval of mean(x) − mean(y) in the words of the evidence."""
    ci = sps.ttest_rel(x, y).confidence_interval(0.95)
    d = sum(x) / len(x) - sum(y) / len(y)
    return f"Δ {d:+.2f} points, 95% CI [{ci.low:+.2f}, {ci.high:+.2f}] (paired t, n = {len(x)})"


def minus(x, y) -> list[float]:
    return [a - b for a, b in zip(x, y, strict=True)]


def test_findings_are_one_contrast_per_pair_then_loses_less_with_their_budgets():
    f = opt.findings(four(GOOD, BAD, GOOD, BAD))
    assert [x.claim for x in f] == [
        "at batch 2048, lr- and warmup-tuned Nesterov matches LARS (within ±1 point: Nado et "
        "al.'s parity)",
        "at batch 2048, lr- and warmup-tuned AdamW matches LAMB (within ±1 point: Nado et al.'s "
        "parity)",
        "from k=16 to k=128 (batch 2048) LARS loses less accuracy than lr- and warmup-tuned "
        "Nesterov",
        "from k=16 to k=128 (batch 2048) LAMB loses less accuracy than lr- and warmup-tuned AdamW",
    ]
    big = Budget({"k=128": 32}, None, opt.NADO_STEPS)
    assert [x.budget for x in f] == [big] * 2 + [
        Budget({"k=16": 256, "k=128": 32}, None, opt.NADO_STEPS)
    ] * 2
    # the paper's text names both expectations: Nado et al.'s parity, You et al.'s "beats"
    assert f[0].paper.startswith("Nado et al. 2021 (matches): tuned Nesterov reaches LARS's")
    assert "You et al. 2017 (LARS beats it)" in f[0].paper
    assert "You et al. 2019 (LAMB beats it)" in f[1].paper


def test_a_budget_names_nado_et_al_s_32k_run_only_beside_the_k_that_stands_for_32k():
    """fashion-long compares at k = 16 (4k by k · 256): its budget names Goyal's 4k run, as every
    study's does, not Nado et al.'s ResNet-50 at 32k."""
    only_16 = final_frame({(a, 16.0): GOOD for a in opt.ARMS})
    f = opt.findings(only_16)
    assert [x.budget for x in f] == [Budget({"k=16": 256}, None, "Goyal's 4k run: 28,151")] * 2
    assert opt.findings(four(GOOD, BAD, GOOD, BAD))[0].budget.paper == opt.NADO_STEPS


def test_the_contrast_is_replayed_when_plain_matches_and_names_a_beat_or_a_loss_otherwise():
    # LARS and LAMB 10 points below the plain optimizers: they beat them, not Nado's parity
    f = opt.findings(four(GOOD, BAD, GOOD, BAD))[:2]
    assert verdicts(f) == [False, False]
    assert paired(BAD, GOOD) in f[0].evidence.replace(" (Nesterov − LARS)", "")
    assert "outcome: LARS beats Nesterov (interval wholly above 0, not inside ±1)" in f[0].evidence
    assert "outcome: LAMB beats AdamW (interval wholly above 0, not inside ±1)" in f[1].evidence
    assert (f[0].p_for, f[0].p_against) == (1.0, pytest.approx(sps.ttest_rel(BAD, GOOD).pvalue))
    assert (
        "k=128: LARS 11.0% vs Nesterov 21.5% test error (mean over 3 seeds; LARS better in 3 of 3)"
        in f[0].evidence
    )
    # the other way round: the layer-wise optimizers lose
    f = opt.findings(four(BAD, GOOD, BAD, GOOD))[:2]
    assert verdicts(f) == [False, False]
    assert "outcome: LARS loses to Nesterov (interval wholly below 0, not inside ±1)" in (
        f[0].evidence
    )
    # Nesterov and AdamW +0.1, +0.1, +0.2 over LARS and LAMB: inside ±1, Nado's parity
    tight = [10.1, 11.1, 12.2]
    f = opt.findings(four(GOOD, tight, GOOD, tight))[:2]
    assert verdicts(f) == [True, True]
    ci = sps.ttest_rel(tight, GOOD).confidence_interval(0.95)
    assert ci.low > -1 and ci.high < 1  # wholly inside ±1
    assert "outcome: LARS matches Nesterov (interval inside ±1)" in f[0].evidence
    # two one-sided tests at the margins, each at α/2
    up = sps.ttest_rel(tight, [g + 1 for g in GOOD], alternative="less").pvalue
    down = sps.ttest_rel(tight, [g - 1 for g in GOOD], alternative="greater").pvalue
    assert f[0].p_for == pytest.approx(2 * max(up, down)) and f[0].p_against == 1
    # +0.5, -1, +0.5: the interval covers 0 and reaches past ±1
    close = [10.5, 10.0, 12.5]
    f = opt.findings(four(GOOD, close, GOOD, close))[0]
    assert f.replayed is None and not f.invalid and "outcome:" not in f.evidence
    assert "undecided: the interval covers 0 and is not inside ±1" in f.evidence
    assert paired(close, GOOD) in f.evidence.replace(" (Nesterov − LARS)", "")


def test_loses_less_compares_each_seeds_change_from_the_small_k():
    # LARS: 10-12 at k=128 from 5-7 at 16 (+5 each); Nesterov: 20-23 from 5-7 (+15 or so)
    f = opt.findings(four(GOOD, BAD, GOOD, BAD))
    assert verdicts(f)[2:] == [True, True]
    assert "LARS +5.0 points, Nesterov +15.5 points" in f[2].evidence
    small = [5.0, 6.0, 7.0]
    assert paired(minus(BAD, small), minus(GOOD, small)) in f[2].evidence
    assert "supports You et al. 2017" in f[2].evidence
    # the layer-wise optimizers start lower at k=16 but lose more
    f = opt.findings(four(GOOD, BAD, GOOD, BAD, small=(17.0, 1.0, 1.0, 17.0)))
    assert verdicts(f)[2:] == [False, False]
    assert "supports Nado et al. 2021" in f[2].evidence


def test_an_arm_that_did_not_train_makes_its_comparisons_invalid():
    chance = [90.0, 90.5, 89.9]
    f = opt.findings(four(chance, chance, chance, chance, small=(89.0, 89.0, 89.0, 89.0)))
    assert [x.outcome for x in f] == ["invalid"] * 4 and verdicts(f) == [None] * 4
    assert all(CHANCE in x.evidence and x.p is None for x in f)
    # Nesterov at chance at k = 16 only: LARS's loss against it is invalid (not "not replayed"),
    # the comparisons at k = 128 and LAMB's loss stand
    f = opt.findings(four(GOOD, BAD, GOOD, BAD, small=(88.0, 5.0, 5.0, 5.0)))
    assert [x.outcome for x in f] == ["not replayed", "not replayed", "invalid", "replayed"]
    assert f"nesterov k=16: its mean error 89.0% is {CHANCE}" in f[2].evidence
    # a diverged Nesterov run at k = 128 counts as 100% error: every comparison with it is invalid
    df = four(GOOD, BAD, GOOD, BAD)
    df.loc[(df["optimizer"] == "sgd") & (df["k"] == 128.0) & (df["seed"] == 1), "status"] = (
        "diverged"
    )
    f = opt.findings(df)
    assert [x.outcome for x in f] == ["invalid", "not replayed", "invalid", "replayed"]
    assert "LARS 11.0% vs Nesterov 47.7%" in f[0].evidence  # (20 + 100 + 23) / 3
    assert all("1 of its 3 runs diverged" in f[i].evidence for i in (0, 2))
    # an invalid comparison supports neither paper, and its evidence does not call it undecided
    assert "supports neither paper (invalid)" in f[2].evidence
    assert "undecided" not in f[0].evidence and "undecided" not in f[2].evidence


def test_one_k_gives_the_two_contrasts_at_it():
    df = four(GOOD, BAD, GOOD, BAD)
    f = opt.findings(df[df["k"] == 128.0])
    assert len(f) == 2 and all(x.claim.startswith("at batch 2048, ") for x in f)


def test_table_holds_the_chosen_settings_beside_their_test_error_and_the_papers():
    trials = trial_frame({(a, k): [5, 6, 7, 8, 9, 10] for a in opt.ARMS for k in (16.0, 128.0)})
    finals = four(GOOD, BAD, GOOD, BAD)
    for arm in opt.ARMS:  # the final runs at each optimizer's chosen setting (lr x 1/3)
        for k in (16.0, 128.0):
            sel = (finals["optimizer"] == opt.arm_keys(CPU, arm)["optimizer"]) & (finals["k"] == k)
            sel &= finals["nesterov"] == opt.arm_keys(CPU, arm)["nesterov"]
            base_lr = opt.anchor(CPU, arm, k) * (1 / 3) / k
            finals.loc[sel, "base_lr"] = base_lr
            finals.loc[sel, "lr"] = base_lr * k
    t = opt.table(trials, finals)
    assert len(t) == 8 and list(t["runs"]) == [3] * 8
    row = t[(t["arm"] == "lars") & (t["k"] == 128.0)].iloc[0]
    assert row[f"{opt.TEST}_mean"] == pytest.approx(11.0) and row[opt.VAL] == 5
    # Nado et al.: Nesterov and LARS at 75.9% top-1 (24.1% error), beside the largest k only
    big = t[t["k"] == 128.0].set_index("arm")["paper_top1_error_pct"]
    assert big["nesterov"] == pytest.approx(24.1) and big["lars"] == pytest.approx(24.1)
    assert t[t["k"] == 16.0]["paper_top1_error_pct"].isna().all()
    text = opt.budget(trials, finals)
    assert text.startswith(
        "6 trials per optimizer and k (6 settings of peak lr, warmup x 1 tuning seed) x 4 optimizers"
    )
    assert "48 tuning runs, then 24 runs of the chosen settings (3 seeds)" in text
    assert "72 minutes of run time in all (72 runs)" in text


def test_parity_gaps_are_the_paired_differences_beside_nados_published_one():
    df = four(GOOD, [x + 1.5 for x in GOOD], GOOD, [12.0, 11.0, 15.0])
    gaps = opt.parity_gaps(df).set_index("pair")
    assert gaps.loc["Nesterov - LARS", "ours"] == pytest.approx(1.5)
    assert gaps.loc["Nesterov - LARS", "ours_std"] == pytest.approx(0.0, abs=1e-12)
    # AdamW - LAMB: 2, 0, 3 (mean 5/3, sd of 2, 0, 3)
    assert gaps.loc["AdamW - LAMB", "ours"] == pytest.approx(5 / 3)
    assert gaps.loc["AdamW - LAMB", "ours_std"] == pytest.approx(1.527525, rel=1e-6)
    # Nado et al.: Nesterov and LARS both 75.9% top-1 at 32k; nothing published for Adam vs LAMB
    assert gaps.loc["Nesterov - LARS", "paper"] == pytest.approx(0.0)
    assert math.isnan(gaps.loc["AdamW - LAMB", "paper"])


def test_a_profiles_own_keys_of_study_14_are_used_and_a_notebooks_epochs_override_them(
    monkeypatch,
):
    keys = {**opt.SETTINGS["smoke"], "keys": {"epochs": 3, "fashion_size": 14}}
    monkeypatch.setitem(opt.SETTINGS, "smoke", keys)
    run = opt.arm_keys(scales.PROFILES["smoke"], "lamb")
    assert run["epochs"] == 3 and run["fashion_size"] == 14 and run["optimizer"] == "lamb"
    assert "epochs" not in opt.arm_keys(scales.PROFILES["cpu"], "lamb")  # none: the profile's
    # the notebook's epochs replace the study's own length too
    assert opt.arm_keys(scales.get("smoke", epochs=1), "lamb")["epochs"] == 1


# -- fashion-long's quasi-random search: lr, warmup and weight decay on one budget -------------------


def test_the_search_gives_every_optimizer_the_same_points_on_three_tuning_seeds():
    """fashion-long tunes by Nado et al.'s quasi-random search: 10 Halton points, each (lr as a
    factor of the optimizer's centre, warmup, weight decay as a factor of its default) the same for
    all four optimizers, each point on 3 tuning seeds none of the finals use: 120 trials."""
    long = scales.get("fashion-long")
    search = opt.Grid.of(None, None, long)
    assert isinstance(search, opt.Search) and search.trials == 30
    cfgs = valid(opt.trials(long, search))
    assert len(cfgs) == 120 and {c.seed for c in cfgs} == {1000, 1001, 1002}
    assert not {c.seed for c in cfgs} & set(long.seeds)
    points = {}
    for c in cfgs:
        arm = opt.arm_of(c.optimizer, c.nesterov)
        rel = (
            round(peak(c) / opt.anchor(long, arm, 16), 3),
            c.warmup_epochs,
            round(c.weight_decay / opt.weight_decay(long, arm), 2),
        )
        points.setdefault(arm, set()).add(rel)
    assert len({frozenset(p) for p in points.values()}) == 1  # the same ten for every optimizer
    (same,) = {frozenset(p) for p in points.values()}
    lrs, warm, decay = zip(*same, strict=True)
    assert len(same) == 10 and len(set(lrs)) == 10
    assert min(lrs) >= 0.25 and max(lrs) <= 4 and min(warm) >= 0 and max(warm) <= 1
    assert min(decay) >= 0.25 and max(decay) <= 4
    assert opt.weight_decay(long, "adamw") == opt.ADAM_WEIGHT_DECAY
    assert opt.weight_decay(long, "nesterov") == long.base["weight_decay"]


def test_the_search_points_are_a_scrambled_halton_sequence_stretched_to_its_ranges():
    from scipy.stats import qmc

    s = opt.Search(points=4, lr_octaves=1.0, max_warmup=0.5, decay_octaves=3.0)
    u = qmc.Halton(d=3, scramble=True, rng=np.random.default_rng(0)).random(4)
    for (f, w, d), (a, b, c) in zip(s.settings(), u, strict=True):
        assert f == pytest.approx(2 ** (2 * a - 1), rel=5e-3)
        assert w == pytest.approx(0.5 * b, rel=5e-3, abs=1e-9)
        assert d == pytest.approx(2 ** (3 * (2 * c - 1)), rel=5e-3)
    assert (
        s.settings()
        == opt.Search(points=4, lr_octaves=1.0, max_warmup=0.5, decay_octaves=3.0).settings()
    )


def test_a_grid_keeps_its_weight_decay_so_cpu_and_fashions_runs_are_the_same_experiments():
    grid = opt.Grid.of(None, None, CPU)
    assert {d for *_, d in grid.settings()} == {1.0}
    for c in valid(opt.trials(CPU, grid)):
        assert c.weight_decay == opt.weight_decay(CPU, opt.arm_of(c.optimizer, c.nesterov))


def test_below_b_crit_the_claims_say_so_and_take_no_side_of_nado_or_you():
    """Nado et al. and You et al. compare optimizers beyond the critical batch: at batch 2048 with
    B_crit 621 the claims keep their names; with B_crit 5,000 the same runs are "below this
    profile's B_crit", with no parity label, no paper expectation and no "supports" clause."""
    df = four(GOOD, BAD, GOOD, BAD)
    above = opt.findings(df, regime=opt.Regime("lr-tuned", 620.7))
    below = opt.findings(df, regime=opt.Regime("lr-, warmup- and decay-tuned", 5000.0))
    assert above[0].claim == (
        "at batch 2048, at or above this profile's B_crit 621, lr-tuned Nesterov matches LARS "
        "(within ±1 point: Nado et al.'s parity)"
    )
    assert above[0].paper.startswith("Nado et al. 2021") and "supports" in above[2].evidence
    decay = f"weight decay {opt.weight_decay(CPU, 'lars'):.3g}"
    assert (
        f"LARS lr {opt.anchor(CPU, 'lars', 128):.3g}, warmup 0.25 ep, {decay}" in above[0].evidence
    )
    assert below[0].claim == (
        "at batch 2048, below this profile's B_crit 5000, lr-, warmup- and decay-tuned Nesterov "
        "matches LARS (within ±1 point)"
    )
    assert all(f.paper == opt.BELOW for f in below) and "Nado" not in below[0].claim
    assert not any("supports" in f.evidence for f in below)
    # the verdicts themselves do not move with the words
    assert [f.outcome for f in below] == [f.outcome for f in above]


def test_the_claims_name_what_the_trials_tuned():
    grid = trial_frame({("lars", 128.0): [30, 31, 20, 25, 40, 41]})
    assert opt.tuned_words(grid) == "lr- and warmup-tuned"
    one_warmup = grid[grid["warmup_epochs"] == 0.25]
    assert opt.tuned_words(one_warmup) == "lr-tuned"
    searched = grid.assign(weight_decay=[1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 6e-4])
    assert opt.tuned_words(searched) == "lr-, warmup- and decay-tuned"


def test_a_papers_row_sits_beside_the_k_that_stands_for_its_batch():
    """Nado et al.'s 32k is k = 128 by k · 256: beside k = 128, never beside k = 16 (4k), even
    when k = 16 is the study's largest."""
    trials = trial_frame({(a, k): [5, 6, 7, 8, 9, 10] for a in opt.ARMS for k in (16.0, 128.0)})
    finals = four(GOOD, BAD, GOOD, BAD)
    for arm in opt.ARMS:
        for k in (16.0, 128.0):
            sel = (finals["optimizer"] == opt.arm_keys(CPU, arm)["optimizer"]) & (finals["k"] == k)
            sel &= finals["nesterov"] == opt.arm_keys(CPU, arm)["nesterov"]
            finals.loc[sel, "base_lr"] = opt.anchor(CPU, arm, k) * (1 / 3) / k
            finals.loc[sel, "lr"] = opt.anchor(CPU, arm, k) * (1 / 3)
    both = opt.table(trials, finals)
    assert both[both["k"] == 128.0]["paper_top1_error_pct"].notna().sum() == 2  # Nesterov, LARS
    only16 = opt.table(trials[trials["k"] == 16.0], finals[finals["k"] == 16.0])
    assert len(only16) == 4 and only16["paper_top1_error_pct"].isna().all()


def test_an_edge_extension_moves_the_first_points_one_range_width_and_widens_the_edge_test():
    from lbsgd.lab.studies import optimizers_at_scale as big

    a = big.SETTINGS["fashion-long"]
    base = big.points(a)[: a.extension[0]]
    for edge, i, move in (
        ("low weight decay", 2, lambda x: x / 16),
        ("high lr", 0, lambda x: x * 16),
        ("high warmup", 1, lambda x: x + 4.0),
    ):
        moved = big.points(a, edge)
        assert len(moved) == 6
        for b, m in zip(base, moved, strict=True):
            assert m[i] == pytest.approx(move(b[i]))
            assert [x for j, x in enumerate(m) if j != i] == [x for j, x in enumerate(b) if j != i]
    # a point on the low edge of the first box is inside the extended one; its far end an edge
    assert big.edge_of(a, 1.0, 1.0, 0.3) == "low weight decay"
    assert big.edge_of(a, 1.0, 1.0, 0.3, moved="low weight decay") == ""
    assert big.edge_of(a, 1.0, 1.0, 0.3 / 16, moved="low weight decay") == "low weight decay"
    assert big.edge_of(a, 1.0, 3.7, 1.0, moved="high warmup") == ""
    assert big.edge_of(a, 1.0, 7.6, 1.0, moved="high warmup") == "high warmup"
    # the other side of the extended axis keeps its edge
    assert big.edge_of(a, 1.0, 1.0, 3.5, moved="low weight decay") == "high weight decay"


def test_an_extensions_first_rung_trains_only_the_optimizers_on_an_edge_over_the_moved_box():
    from lbsgd.lab.studies import optimizers_at_scale as big

    p, c = scales.get("smoke"), {"nesterov": 1.0, "lars": 2.0, "lamb": 0.01, "adamw": 0.01}
    first = big.halving(p, c, None, 0)
    moved = big.halving(p, c, None, 0, {"adamw": "high lr"})
    adamw = [r for r in first if r["optimizer"] == "adamw"]
    assert [r["optimizer"] for r in moved] == ["adamw"] * big.SETTINGS["smoke"].extension[0]
    assert [r["base_lr"] for r in moved] == pytest.approx([16 * r["base_lr"] for r in adamw])
    assert [r["seed"] for r in moved] == [big.SETTINGS["smoke"].tuning_seeds[0]] * 2


def test_an_extended_search_voids_its_claims_only_past_the_budget():
    from lbsgd.lab.studies import optimizers_at_scale as big

    df = final_frame(
        {(a, 128.0): e for a, e in zip(opt.ARMS, (GOOD, GOOD, GOOD, BAD), strict=True)}
    )
    chosen = pd.DataFrame(
        [{"arm": a, "k": 128.0, "lr_at_grid_edge": "", "extended": ""} for a in opt.ARMS]
    )
    chosen.loc[chosen["arm"] == "adamw", "extended"] = "low weight decay"
    regime = opt.Regime("lr, warmup and weight decay", 364.0)
    within = big.findings(df, chosen, regime, big.BUDGET_H)
    past = big.findings(df, chosen, regime, big.BUDGET_H + 0.1)
    assert not any(f.invalid for f in within)
    assert [f.outcome for f in past][0] == within[0].outcome  # Nesterov and LARS: not extended
    assert past[1].invalid and past[1].replayed is None, past[1].evidence
    assert "the search of adamw was extended and the new runs took 12.1 h" in past[1].evidence
    assert past[1].evidence.startswith(within[1].evidence.split("; undecided: ")[0])
    # within the priced budget but past it as recorded: decided, the other reading said beside
    shared = big.findings(df, chosen, regime, 11.5, 15.2)
    assert [f.outcome for f in shared] == [f.outcome for f in within]
    assert shared[1].evidence.endswith(
        "11.5 h as priced, 15.2 h as recorded on a shared machine (read that way: invalid)"
    )
    assert shared[0].evidence == within[0].evidence  # Nesterov and LARS: not extended
    # the budget prices every step trained at the registered 230 s of a 430-step run
    two = pd.DataFrame({"steps": [430, 120], "total_wall_time_s": [500.0, 100.0]})
    fl = scales.get("fashion-long")
    assert big.hours(fl, two, two) == pytest.approx(2 * 230 * 550 / 430 / 3600)
    assert big.hours(fl, two, recorded=True) == pytest.approx(600 / 3600)
