"""Studies 6-9, the large-batch recipes (lbsgd.lab.studies.lars, bn_decay, pool5_bn, mixed_precision),
on hand-made tables: each finding replayed, not replayed, undecided and invalid (an arm that did
not train) by the 95% t interval of its difference (the expected intervals computed here with
scipy), the run lists of the cpu and smoke profiles, and the papers' numbers on the right table
rows."""

from types import SimpleNamespace

import pandas as pd
import pytest
from helpers import verdicts
from scipy import stats as sps

from lbsgd import config, models, optim
from lbsgd.lab.findings import Budget
from lbsgd.lab.studies import bn_decay, lars, mixed_precision, pool5_bn, scales

CPU, SMOKE = scales.get("cpu"), scales.get("smoke")
CHANCE = "within 5 points of chance (90%)"  # synthetic data: 10 classes


def frame(rows: list[dict], **common) -> pd.DataFrame:
    """Runs as ``experiments.load_runs`` gives them: the columns the study modules read; a run at
    k takes 4096 / k optimizer steps (k = 128: 32)."""
    base = {
        "dataset": "synthetic",
        "status": "completed",
        "final_train_loss": 0.5,
        "lr": 1.0,
        "skipped_steps": 0,
        "img_per_s": 1000.0,
        **common,
    }
    out = pd.DataFrame([{**base, **r} for r in rows])
    out["batch_size"] = (out["k"] * 16).astype(int)
    out["total_steps"] = (4096 / out["k"]).astype(int)
    return out


def by_seed(errors: list[float], **keys) -> list[dict]:
    return [{**keys, "seed": s, "final_top1_error_pct": e} for s, e in enumerate(errors)]


def valid(runs: list[dict], study: str) -> None:
    for r in runs:  # every run is a config the sweep accepts
        config.from_dict({**r, "study": study})


def mean(values) -> float:
    return sum(values) / len(values)


def words(x, y, ci, test: str, n: int) -> str:
    """The verdict's interval in the words of the evidence."""
    return (
        f"Δ {mean(x) - mean(y):+.2f} points, 95% CI [{ci.low:+.2f}, {ci.high:+.2f}] "
        f"({test}, n = {n})"
    )


def paired(x, y) -> str:
    """scipy's paired-t 95% interval of mean(x) − mean(y), seed i of x with seed i of y."""
    return words(x, y, sps.ttest_rel(x, y).confidence_interval(0.95), "paired t", len(x))


def pooled(lone: float, y) -> str:
    """scipy's Student's pooled-t 95% interval of a lone run less the mean of ``y``."""
    ci = sps.ttest_ind([lone], y, equal_var=True).confidence_interval(0.95)
    return words([lone], y, ci, "pooled t, a lone run", 1)


def minus(x, y) -> list[float]:
    return [a - b for a, b in zip(x, y, strict=True)]


# -- 6. LARS -----------------------------------------------------------------------------------


def lars_runs(
    resnet_lars, resnet_sgd, alex_lars, alex_sgd, small=(5.0, 4.5), mid=None
) -> pd.DataFrame:
    """ResNet at k = 4 (seed 0: LARS, SGD errors ``small``, level by default), at k = 16 when
    ``mid`` is given (seed 0 likewise) and at k = 128 (per seed), AlexNet-BN at k = 64 (per
    seed)."""
    starts = {4.0: small} if mid is None else {4.0: small, 16.0: mid}
    rows = [
        {"model": "resnet", "optimizer": o, "k": k, "seed": 0, "final_top1_error_pct": e}
        for k, pair in starts.items()
        for o, e in zip(("lars", "sgd"), pair, strict=True)
    ]
    for model, k, opt, errs in (
        ("resnet", 128.0, "lars", resnet_lars),
        ("resnet", 128.0, "sgd", resnet_sgd),
        ("alexnet_bn", 64.0, "lars", alex_lars),
        ("alexnet_bn", 64.0, "sgd", alex_sgd),
    ):
        rows += by_seed(errs, model=model, optimizer=opt, k=k)
    return frame(rows)


# per-seed differences BAD − GOOD: +20, +21, +19 (a spread of 1 around 20)
GOOD, BAD = [10.0, 11.0, 12.0], [30.0, 32.0, 31.0]
GOYAL_32K = "Goyal's 32k run: 3,519"  # k = 128 stands for 32,768: ceil(90 · 1,281,167 / 32,768)


def test_lars_beats_sgd_replayed_not_replayed_and_undecided_per_network():
    f = lars.findings(lars_runs(GOOD, BAD, GOOD, BAD))
    assert verdicts(f)[:2] == [True, True]
    assert f[0].claim == (
        "at the largest minibatch LARS beats SGD at the linear rule's lr, untuned (resnet)"
    )
    assert lars.TUNED_ELSEWHERE in f[0].evidence  # SGD untuned here, tuned in study 14
    # SGD's error less LARS's above 0, paired by seed
    assert paired(BAD, GOOD) in f[0].evidence
    assert f[0].p_for == pytest.approx(sps.ttest_rel(BAD, GOOD).pvalue) and f[0].p_against == 1
    assert f[0].budget == Budget({"k=128": 32}, None, GOYAL_32K)
    assert f[1].budget.steps == {"k=64": 64}

    f = lars.findings(lars_runs(BAD, GOOD, BAD, GOOD))
    assert verdicts(f)[:2] == [False, False]
    assert f[0].p_against == pytest.approx(sps.ttest_rel(GOOD, BAD).pvalue) and f[0].p_for == 1

    # per-seed differences SGD − LARS: -7, +2, +11: the interval reaches across 0
    lars_, wide = [17.0, 18.0, 19.0], [10.0, 20.0, 30.0]
    f = lars.findings(lars_runs(lars_, wide, GOOD, BAD))
    assert f[0].replayed is None and not f[0].invalid
    assert paired(wide, lars_) in f[0].evidence
    assert "undecided: the interval reaches across the threshold +0" in f[0].evidence
    assert f[1].replayed is True
    assert (
        "LARS better in 3 of 3 seeds" in f[1].evidence and "You et al. AlexNet-BN" in f[1].evidence
    )


def test_lars_findings_with_an_arm_at_chance_are_invalid_and_on_one_seed_undecided():
    chance = [89.0, 90.0, 91.0]
    f = lars.findings(lars_runs(chance, chance, chance, chance, small=(90.0, 89.5)))
    assert [x.outcome for x in f] == ["invalid"] * 3 and verdicts(f) == [None] * 3
    assert all("invalid: an arm did not train" in x.evidence for x in f)
    assert all(CHANCE in x.evidence and x.p is None for x in f)
    # SGD at chance at k = 128, LARS trained: a win over an arm that did not train says nothing
    f = lars.findings(lars_runs(GOOD, [86.0, 88.0, 90.0], GOOD, BAD))
    assert [x.outcome for x in f] == ["invalid", "replayed", "invalid"]
    assert f"an arm did not train (its mean error 88.0% is {CHANCE})" in f[0].evidence
    assert f"sgd k=128: its mean error 88.0% is {CHANCE}" in f[2].evidence
    # the level k's runs at chance: the loss from there is invalid
    f = lars.findings(lars_runs(GOOD, BAD, GOOD, BAD, small=(90.0, 89.5)))
    assert f[2].outcome == "invalid" and f"lars k=4: its mean error 90.0% is {CHANCE}" in (
        f[2].evidence
    )

    one = lars.findings(lars_runs([10.0], [30.0], [10.0], [30.0]))
    assert verdicts(one) == [None, None, None] and not any(x.invalid for x in one)
    assert all("undecided: one run per arm" in x.evidence for x in one)


def test_a_diverged_lars_run_counts_as_full_error_and_makes_the_comparison_invalid():
    df = lars_runs(GOOD, BAD, GOOD, BAD)
    seed1 = (df["model"] == "resnet") & (df["optimizer"] == "lars") & (df["k"] == 128.0)
    df.loc[seed1 & (df["seed"] == 1), "status"] = "diverged"
    f = lars.findings(df)
    assert f[0].outcome == "invalid" and f[0].replayed is None
    assert "LARS 40.7% vs SGD 31.0%" in f[0].evidence  # (10 + 100 + 12) / 3
    assert "invalid: an arm did not train (1 of its 3 runs diverged)" in f[0].evidence
    assert f[1].replayed is True  # AlexNet-BN's runs all trained
    assert f[2].outcome == "invalid" and "lars k=128: 1 of its 3 runs diverged" in f[2].evidence


def test_lars_loses_less_from_the_level_k_to_the_largest_k():
    # level at k = 4 (5.0 vs 4.5): change LARS +5, +6, +7; SGD +25.5, +27.5, +26.5
    f = lars.findings(lars_runs(GOOD, BAD, GOOD, BAD))[2]
    assert f.claim == (
        "from the smallest k where both start level (within 1 point) to k=128 LARS loses less "
        "accuracy than SGD (resnet)"
    )
    assert f.replayed is True
    assert "from k=4: error change LARS +6.0 points, SGD +26.5 points" in f.evidence
    d_lars, d_sgd = minus(GOOD, [5.0] * 3), minus(BAD, [4.5] * 3)
    assert paired(d_sgd, d_lars) in f.evidence
    assert "AlexNet-BN from 512 to 8192: LARS +0.1 points, SGD +2.2 points" in f.evidence
    assert f.budget == Budget({"k=4": 1024, "k=128": 32}, None, GOYAL_32K)
    # LARS +35 to +37, SGD +25.5 to +27.5: it loses more
    assert lars.findings(lars_runs([40.0, 41.0, 42.0], BAD, GOOD, BAD))[2].replayed is False
    # LARS +20, +30, +40 vs SGD's: per-seed differences +5.5, -2.5, -13.5 reach across 0
    spread = [25.0, 35.0, 45.0]
    f = lars.findings(lars_runs(spread, BAD, GOOD, BAD))[2]
    assert f.replayed is None and not f.invalid
    assert paired(d_sgd, minus(spread, [5.0] * 3)) in f.evidence
    assert "undecided: the interval reaches across the threshold +0" in f.evidence


def test_lars_loses_less_is_undecided_when_lars_and_sgd_never_start_level():
    # 2 and 3 points apart at k = 4 and 16; from k = 4 LARS would lose +6 to SGD's +28
    f = lars.findings(lars_runs(GOOD, BAD, GOOD, BAD, small=(5.0, 3.0), mid=(9.0, 6.0)))[2]
    assert f.replayed is None and not f.invalid and f.p is None and f.budget is None
    assert "k=4: LARS 5.0% vs SGD 3.0%; k=16: LARS 9.0% vs SGD 6.0%" in f.evidence
    assert "undecided: LARS and SGD start level (within 1 point) at no smaller k" in f.evidence


def test_lars_loses_less_is_measured_from_the_smallest_k_where_both_start_level():
    # k = 4 is not level (LARS 30, SGD 3): from there LARS would lose +11, SGD +28 (replayed);
    # k = 16 is (8.0 vs 7.5): from there LARS loses +32 to +34, SGD +22.5 to +24.5
    big_lars = [40.0, 41.0, 42.0]
    f = lars.findings(lars_runs(big_lars, BAD, GOOD, BAD, small=(30.0, 3.0), mid=(8.0, 7.5)))[2]
    assert f.replayed is False
    assert "from k=16: error change LARS +33.0 points, SGD +23.5 points (k=16: seed 0 only)" in (
        f.evidence
    )
    assert paired(minus(BAD, [7.5] * 3), minus(big_lars, [8.0] * 3)) in f.evidence
    assert f.budget.steps == {"k=16": 256, "k=128": 32}
    # level at both: the smaller k
    f = lars.findings(lars_runs(GOOD, BAD, GOOD, BAD, small=(5.0, 4.5), mid=(8.0, 7.5)))[2]
    assert f.replayed is True and "from k=4: error change" in f.evidence


def test_lars_runs_of_the_cpu_and_smoke_profiles():
    runs = lars.runs(CPU, [0, 1, 2])
    assert len(runs) == 16  # ResNet: 2 optimizers x (1 + 1 + 3 seeds); AlexNet-BN: 2 x 3 seeds
    resnet = [
        (r["batch_size"], r.get("optimizer", "sgd"), r["seed"])
        for r in runs
        if r["model"] == "resnet"
    ]
    assert resnet == [
        (64, "sgd", 0),
        (64, "lars", 0),
        (256, "sgd", 0),
        (256, "lars", 0),
        *[(2048, "sgd", s) for s in range(3)],
        *[(2048, "lars", s) for s in range(3)],
    ]
    alex = [r for r in runs if r["model"] == "alexnet_bn"]
    assert {r["batch_size"] for r in alex} == {1024} and len(alex) == 6
    lars_alex = [r for r in alex if r.get("optimizer") == "lars"]
    assert {r["base_lr"] for r in lars_alex} == {0.25}  # the profile's AlexNet LARS lr
    assert all(r["nesterov"] is False and r["lars_eta"] == 0.001 for r in lars_alex)
    valid(runs, "lars")

    smoke = lars.runs(SMOKE, [0])
    assert [(r["model"], r["batch_size"], r.get("optimizer", "sgd")) for r in smoke] == [
        ("resnet", 64, "sgd"),
        ("resnet", 64, "lars"),
        ("resnet", 256, "sgd"),
        ("resnet", 256, "lars"),
        ("alexnet_bn", 256, "sgd"),
        ("alexnet_bn", 256, "lars"),
    ]
    valid(smoke, "lars")


def test_lars_runs_take_the_given_lr_ks_and_length():
    runs = lars.runs(CPU, [0, 1], ks=[2, 8], lars_base_lr=0.5)
    assert sorted({r["batch_size"] for r in runs}) == [32, 128]
    assert {r["base_lr"] for r in runs if r.get("optimizer") == "lars"} == {0.5}
    # imagenet's LARS keys carry their own length (100 epochs): an epochs override wins
    imagenet = scales.get("imagenet", epochs=3)
    assert {r["epochs"] for r in lars.runs(imagenet, [0], epochs=3)} == {3}
    assert 100 in {r["epochs"] for r in lars.runs(scales.get("imagenet"), [0])}


def test_lars_table_puts_the_papers_numbers_on_their_rows():
    t = lars.table(lars_runs(GOOD, BAD, GOOD, BAD)).set_index(["arch", "optimizer", "k"])
    row = t.loc[("resnet", "lars", 128.0)]
    assert row["final_top1_error_pct_mean"] == pytest.approx(11.0) and row["runs"] == 3
    assert row["paper_batch"] == 32768 and row["paper_top1_error_pct"] == pytest.approx(27.7)
    assert t.loc[("alexnet_bn", "sgd", 32.0), "paper_top1_error_pct"] == pytest.approx(42.0)
    assert pd.isna(t.loc[("alexnet_bn", "sgd", 32.0), "runs"])  # theirs only
    assert t.loc[("resnet", "sgd", 256.0), "paper_variant"] == "no LARS (mixed precision)"
    assert pd.isna(t.loc[("resnet", "sgd", 4.0), "paper_batch"])  # ours only
    assert "alexnet" not in set(t.index.get_level_values("arch"))  # plain AlexNet: not trained


# -- 7. no weight decay on BN and biases -------------------------------------------------------


def decay_runs(no_decay, decay, k=128.0) -> pd.DataFrame:
    return frame(
        [*by_seed(no_decay, decay_bn_bias=False), *by_seed(decay, decay_bn_bias=True)],
        model="resnet",
        optimizer="lars",
        k=k,
    )


def test_bn_decay_finding_replayed_not_replayed_undecided_and_invalid_at_chance():
    (f,) = bn_decay.findings(decay_runs(GOOD, BAD))
    assert f.replayed is True
    assert (
        "k=128: no decay 11.0% vs decay 31.0% error (mean of 3; no decay better in 3 of 3"
        in f.evidence
    )
    assert "ResNet-50 71.9 to 76.2 (error 28.1 to 23.8), AlexNet 55.8 to 57.1" in f.evidence
    assert paired(BAD, GOOD) in f.evidence  # decay's error less no decay's, paired by seed
    assert f.budget == Budget({"k=128": 32}, None, GOYAL_32K)
    assert bn_decay.findings(decay_runs(BAD, GOOD))[0].replayed is False
    # per-seed differences decay − no decay: +11, +2, -7
    no, yes = [10.0, 20.0, 30.0], [21.0, 22.0, 23.0]
    (f,) = bn_decay.findings(decay_runs(no, yes))
    assert f.replayed is None and not f.invalid and paired(yes, no) in f.evidence
    (at_chance,) = bn_decay.findings(decay_runs([88.0, 89.0], [90.0, 91.0]))
    assert at_chance.outcome == "invalid" and at_chance.replayed is None
    assert f"an arm did not train (its mean error 90.5% is {CHANCE})" in at_chance.evidence


def test_bn_decay_runs_change_the_decay_alone_and_the_table():
    runs = bn_decay.runs(CPU, [0, 1, 2])
    assert [(r["decay_bn_bias"], r["seed"]) for r in runs] == [
        (True, 0),
        (True, 1),
        (True, 2),
        (False, 0),
        (False, 1),
        (False, 2),
    ]
    assert {r["batch_size"] for r in runs} == {2048} and {r["optimizer"] for r in runs} == {"lars"}
    # both arms are notebook 6's LARS runs at that k with BN and biases in the trust ratio (the
    # decayed arm by default), so their optimizers' groups differ in the decay alone
    six = [
        r
        for r in lars.runs(CPU, [0, 1, 2])
        if r.get("optimizer") == "lars" and r["batch_size"] == 2048
    ]
    assert [{**r, "decay_bn_bias": True} for r in six] == [r for r in runs if r["decay_bn_bias"]]
    assert [{**r, "decay_bn_bias": False, "adapt_bn_bias": True} for r in six] == [
        r for r in runs if not r["decay_bn_bias"]
    ]
    model = models.build(
        SimpleNamespace(model="resnet", depth=8, width=8, zero_init_residual=False), 10, 16
    )
    groups = [
        [
            (g["weight_decay"] > 0, g["adapt"], len(g["params"]))
            for g in optim.param_groups(model, config.from_dict(r))
        ]
        for r in (runs[0], runs[3])
    ]
    assert groups == [[(True, True, 29)], [(True, True, 10), (False, True, 19)]]
    assert len(bn_decay.runs(SMOKE, [0])) == 2
    valid(runs, "bn_decay")

    t = bn_decay.table(decay_runs(GOOD, BAD))
    assert list(t["decay_bn_bias"]) == [True, False]  # the paper's order: with decay first
    assert list(t["paper_top1_acc_pct"]) == [71.9, 76.2]
    assert list(t["final_top1_error_pct_mean"]) == [31.0, 11.0]


# -- 8. pool5-BN -------------------------------------------------------------------------------


def pool5_runs(bn, none, decay) -> pd.DataFrame:
    rows = [
        *by_seed(bn, decay_bn_bias=False, pool5_bn=True),
        *by_seed(none, decay_bn_bias=False, pool5_bn=False),
        *by_seed(decay, decay_bn_bias=True, pool5_bn=False),
    ]
    return frame(rows, model="alexnet", optimizer="lars", k=64.0, lr=16.0)


def test_pool5_bn_finding_replayed_not_replayed_undecided():
    f = pool5_bn.findings(pool5_runs(GOOD, BAD, [50.0, 51.0, 52.0]))
    # one claim: the no-decay claim concerns Jia et al.'s AlexNet with BN, not plain AlexNet
    assert [x.claim for x in f] == [
        "BN after pool5 improves AlexNet over no pool5-BN (no decay on bias and BN)"
    ]
    assert verdicts(f) == [True]
    assert "pool5-BN 11.0% vs none 31.0%" in f[0].evidence
    assert "Jia et al. accuracy 57.1 to 58.8" in f[0].evidence
    assert paired(BAD, GOOD) in f[0].evidence
    assert f[0].budget.steps == {"k=64": 64}

    assert verdicts(pool5_bn.findings(pool5_runs(BAD, GOOD, [1.0, 2.0, 3.0]))) == [False]

    # per-seed differences none − pool5-BN: +9, +1, -7
    bn, none = [10.0, 20.0, 30.0], [19.0, 21.0, 23.0]
    (f,) = pool5_bn.findings(pool5_runs(bn, none, [22.0, 18.0, 20.0]))
    assert f.replayed is None and not f.invalid
    assert paired(none, bn) in f.evidence and "the interval reaches across" in f.evidence


def test_pool5_bn_is_invalid_when_plain_alexnet_is_at_chance():
    # the committed cpu replay: pool5-BN learned, plain AlexNet without decay stayed at chance
    (f,) = pool5_bn.findings(pool5_runs([50.0, 55.0, 69.0], [90.0] * 3, [76.0, 84.0, 89.0]))
    assert f.outcome == "invalid" and f.replayed is None and f.p is None
    assert "pool5-BN 58.0% vs none 90.0%" in f.evidence
    assert f"invalid: an arm did not train (its mean error 90.0% is {CHANCE})" in f.evidence
    chance = [89.0, 90.0, 91.0]
    (f,) = pool5_bn.findings(pool5_runs(chance, chance, chance))
    assert f.outcome == "invalid"
    # the decayed arm is no part of the claim: at chance it changes nothing
    (f,) = pool5_bn.findings(pool5_runs(GOOD, BAD, [90.0] * 3))
    assert f.replayed is True


def test_pool5_bn_runs_and_table():
    runs = pool5_bn.runs(CPU, [0, 1, 2])
    assert len(runs) == 9 and {r["model"] for r in runs} == {"alexnet"}
    assert {r["batch_size"] for r in runs} == {1024} and {r["base_lr"] for r in runs} == {0.25}
    assert [(r["decay_bn_bias"], r["pool5_bn"]) for r in runs[::3]] == list(pool5_bn.SETTINGS)
    assert len(pool5_bn.runs(SMOKE, [0])) == 3
    valid(runs, "pool5_bn")

    t = pool5_bn.table(pool5_runs(GOOD, BAD, [50.0, 51.0, 52.0]))
    assert list(t["paper_row"]) == [1, 2, 3, 4, 5]
    assert list(t["paper_top1_acc_pct"]) == [55.8, 56.3, 56.4, 57.1, 58.8]
    assert list(t["final_top1_error_pct_mean"].iloc[[0, 3, 4]]) == [51.0, 31.0, 11.0]
    assert t["runs"].isna().tolist() == [False, True, True, False, False]
    assert t.loc[1, "replayed_here"].endswith("those of row 1)")
    assert t.loc[2, "replayed_here"].endswith("those of row 4)")
    assert t.loc[4, "note"] == "the BN after pool5 is the only BN"


# -- 9. mixed precision ------------------------------------------------------------------------


def precision_runs(fp32, fp16, bf16, ran_on="cpu", ips=(1000.0, 300.0, 900.0)) -> pd.DataFrame:
    rows = []
    for p, errs, speed in (("fp32", fp32, ips[0]), ("fp16", fp16, ips[1]), ("bf16", bf16, ips[2])):
        rows += by_seed(errs, precision=p, img_per_s=speed)
    return frame(rows, model="resnet", optimizer="sgd", k=16.0, ran_on=ran_on)


def test_a_lone_half_precision_run_is_judged_against_every_fp32_seed_by_pooled_t():
    fp32 = [5.0, 5.1, 4.9]  # standard deviation 0.1
    # one seed each (the cpu profile): fp16 1.0 below fp32's mean, bf16 3.0 above
    f = mixed_precision.findings(precision_runs(fp32, [4.0], [8.0]))
    assert f[0].claim == "fp16 reaches the accuracy of fp32 (error no more than 1 point above)"
    assert f[1].claim.startswith("bf16")
    assert verdicts(f)[:2] == [True, False]
    # the interval is Student's pooled t's, the lone run against all three fp32 seeds
    assert pooled(4.0, fp32) in f[0].evidence and pooled(8.0, fp32) in f[1].evidence
    margin = [v + mixed_precision.TOLERANCE_PCT for v in fp32]  # the null: 1 point above
    assert f[0].p_for == pytest.approx(sps.ttest_ind([4.0], margin, equal_var=True).pvalue)
    assert f[1].p_against == pytest.approx(sps.ttest_ind([8.0], margin, equal_var=True).pvalue)
    assert "fp16 4.0% vs fp32 5.0% error at k=16 (mean of the same 1 seeds" in f[0].evidence
    assert "one run against fp32's 3 seeds" in f[0].evidence
    assert "76.2% accuracy with LARS" in f[0].evidence
    # 0.8 above: its interval [+0.30, +1.30] reaches across the margin
    f = mixed_precision.findings(precision_runs(fp32, [5.8], [4.0]))[0]
    assert f.replayed is None and not f.invalid and pooled(5.8, fp32) in f.evidence
    assert "undecided: the interval reaches across the threshold +1" in f.evidence
    # fp32 on one seed too: no interval
    one = mixed_precision.findings(precision_runs([4.0], [4.2], [4.1]))
    assert verdicts(one)[:2] == [None, None] and "undecided: one run per arm" in one[0].evidence
    chance = mixed_precision.findings(precision_runs([89.0, 90.0, 91.0], [90.5], [89.5]))
    assert [x.outcome for x in chance[:2]] == ["invalid", "invalid"]
    assert f"an arm did not train (its mean error 90.5% is {CHANCE})" in chance[0].evidence


def test_half_precision_on_common_seeds_reaches_fp32_by_a_paired_non_inferiority_test():
    # seeds far apart, each half-precision run close to its own seed's fp32 run
    fp32 = [3.0, 6.0, 9.0]
    fp16 = [3.2, 6.1, 9.2]  # +0.2, +0.1, +0.2
    bf16 = [5.0, 8.2, 10.9]  # +2.0, +2.2, +1.9
    f = mixed_precision.findings(precision_runs(fp32, fp16, bf16))
    assert verdicts(f)[:2] == [True, False]
    assert paired(fp16, fp32) in f[0].evidence and paired(bf16, fp32) in f[1].evidence
    assert "(mean of the same 3 seeds; within 1 points in 3 of 3" in f[0].evidence
    assert "one run against" not in f[0].evidence
    # unpaired, the seeds' own spread would hide it: Welch's interval reaches past the margin
    assert sps.ttest_ind(fp16, fp32, equal_var=False).confidence_interval(0.95).high > 1
    # +0.2, +2.2, +0.8: a mean 1.07 above whose interval reaches across the margin
    f = mixed_precision.findings(precision_runs(fp32, [3.2, 8.2, 9.8], fp16))
    assert verdicts(f)[:2] == [None, True]
    assert "undecided: the interval reaches across the threshold +1" in f[0].evidence


def test_mixed_precision_is_faster_only_decided_on_a_gpu():
    fp32 = [4.0, 5.0, 6.0]
    f = mixed_precision.findings(
        precision_runs(fp32, [4.2], [4.1], "cuda", (1000.0, 2500.0, 2400.0))
    )
    assert (
        f[2].replayed is True and "fp32 1000, bf16 2400, fp16 2500 img/s on cuda" in f[2].evidence
    )
    slow = precision_runs(fp32, [4.2], [4.1], "cuda:0", (1000.0, 900.0, 950.0))
    assert mixed_precision.findings(slow)[2].replayed is False
    cpu = mixed_precision.findings(precision_runs(fp32, [4.2], [4.1], "cpu"))[2]
    assert cpu.replayed is None and "not a GPU" in cpu.evidence
    assert "6.6 min on 2048x P40" in cpu.evidence


def test_mixed_precision_runs_and_table():
    runs = mixed_precision.runs(CPU, [0, 1, 2])
    assert [(r["precision"], r["seed"]) for r in runs] == [
        ("fp32", 0),
        ("fp32", 1),
        ("fp32", 2),
        ("bf16", 0),
        ("fp16", 0),
    ]
    assert {r["batch_size"] for r in runs} == {256}  # k = 16
    assert len(mixed_precision.runs(CPU, [0, 1, 2], low_seeds=2)) == 7
    smoke = mixed_precision.runs(SMOKE, [0])
    assert [r["precision"] for r in smoke] == ["fp32", "bf16", "fp16"]
    assert {r["batch_size"] for r in smoke} == {128}  # smoke's large k = 8
    assert mixed_precision.runs(CPU, [0], ks=[4, 8])[0]["batch_size"] == 128  # the last k
    valid(runs, "mixed_precision")

    df = precision_runs([4.0, 5.0, 6.0], [4.2], [4.1])
    t = mixed_precision.table(df).set_index("precision")
    assert list(t.index) == ["fp32", "bf16", "fp16"]
    assert t.loc["fp16", "paper_top1_acc_pct"] == 73.2  # Jia et al., SGD in mixed precision
    assert pd.isna(t.loc["fp32", "paper_top1_acc_pct"])
    assert t.loc["fp16", "speed_vs_fp32"] == pytest.approx(0.3)
    thr = mixed_precision.throughput(df).set_index("precision")
    assert thr.loc["bf16", "device"] == "cpu" and thr.loc["bf16", "speed_vs_fp32"] == pytest.approx(
        0.9
    )


# -- what the paper reports, beside every finding ----------------------------------------------


def test_every_finding_of_studies_6_to_9_carries_the_papers_numbers_and_source():
    fs = lars.findings(lars_runs(GOOD, BAD, GOOD, BAD))
    assert [f.paper for f in fs] == [
        "Jia et al. (talk) Table 1: ResNet-50 at 64k accuracy SGD 73.2% vs LARS 76.2%",
        "You et al. Table 1b, Table 3: AlexNet-BN at 8k accuracy SGD 58.0% vs LARS 60.1%",
        "You et al. Table 1b, Table 3: AlexNet-BN from 512 to 8k accuracy SGD 60.2% to 58.0%, "
        "LARS 60.2% to 60.1%",
    ]
    assert [f.paper for f in bn_decay.findings(decay_runs(GOOD, BAD))] == [
        "Jia et al. (talk): accuracy with vs without weight decay: ResNet-50 (on BN) 71.9% vs "
        "76.2%, AlexNet (on bias and BN) 55.8% vs 57.1% (64k, LARS)"
    ]
    assert [f.paper for f in pool5_bn.findings(pool5_runs(GOOD, BAD, [50.0, 51.0, 52.0]))] == [
        "Jia et al. (talk): AlexNet accuracy 57.1% without vs 58.8% with BN after pool5 (no decay "
        "on bias and BN; 64k, LARS)",
    ]
    reached = (
        "Jia et al. (talk) Table 1: no fp32 counterpart published; mixed-precision ResNet-50 at "
        "64k reaches 76.2% accuracy with LARS"
    )
    fs = mixed_precision.findings(precision_runs([4.0, 5.0, 6.0], [4.2], [8.0]))
    assert [f.paper for f in fs] == [
        reached,
        reached,
        "Jia et al. (talk) Table 5: qualitative, no fp32 time to compare; mixed-precision "
        "ResNet-50 at 64k in 6.6 min on 2048x P40 TensorFlow mixed precision, top-1 75.8%",
    ]
