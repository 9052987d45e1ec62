"""Studies 6-9, the large-batch recipes (lbsgd.studies.lars, bn_decay, pool5_bn, mixed_precision),
on hand-made tables: each finding replayed, not replayed and undecided (every run at chance among
the ways), the run lists of the cpu and smoke profiles, and the papers' numbers on the right table
rows."""

import pandas as pd
import pytest
from helpers import verdicts

from lbsgd import config
from lbsgd.studies import bn_decay, lars, mixed_precision, pool5_bn, scales

CPU, SMOKE = scales.get("cpu"), scales.get("smoke")


def frame(rows: list[dict], **common) -> pd.DataFrame:
    """Runs as ``experiments.load_runs`` gives them: the columns the study modules read."""
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
    return out


def by_seed(errors: list[float], **keys) -> list[dict]:
    return [{**keys, "seed": s, "final_top1_error_pct": e} for s, e in enumerate(errors)]


def valid(runs: list[dict], study: str) -> None:
    for r in runs:  # every run is a config the sweep accepts
        config.from_dict({**r, "study": study})


# -- 6. LARS -----------------------------------------------------------------------------------


def lars_runs(resnet_lars, resnet_sgd, alex_lars, alex_sgd, small=(5.0, 3.0)) -> pd.DataFrame:
    """ResNet at k = 4 (seed 0: LARS, SGD errors ``small``) and k = 128 (per seed), AlexNet-BN at
    k = 64 (per seed)."""
    rows = [
        {"model": "resnet", "optimizer": o, "k": 4.0, "seed": 0, "final_top1_error_pct": e}
        for o, e in zip(("lars", "sgd"), small, strict=True)
    ]
    for model, k, opt, errs in (
        ("resnet", 128.0, "lars", resnet_lars),
        ("resnet", 128.0, "sgd", resnet_sgd),
        ("alexnet_bn", 64.0, "lars", alex_lars),
        ("alexnet_bn", 64.0, "sgd", alex_sgd),
    ):
        rows += by_seed(errs, model=model, optimizer=opt, k=k)
    return frame(rows)


GOOD, BAD = [10.0, 11.0, 12.0], [30.0, 31.0, 32.0]


def test_lars_beats_sgd_replayed_not_replayed_and_undecided_per_network():
    assert verdicts(lars.findings(lars_runs(GOOD, BAD, GOOD, BAD)))[:2] == [True, True]
    assert verdicts(lars.findings(lars_runs(BAD, GOOD, BAD, GOOD)))[:2] == [False, False]
    # margin 2 inside the spread (10) of SGD's seeds
    wide = [10.0, 20.0, 30.0]
    f = lars.findings(lars_runs([17.0, 18.0, 19.0], wide, GOOD, BAD))
    assert f[0].replayed is None and "inside the seed spread" in f[0].evidence
    assert f[1].replayed is True
    assert (
        "LARS better in 3 of 3 seeds" in f[1].evidence and "You et al. AlexNet-BN" in f[1].evidence
    )


def test_lars_findings_at_chance_or_on_one_seed_are_undecided():
    chance = [89.0, 90.0, 91.0]
    f = lars.findings(lars_runs(chance, chance, chance, chance, small=(90.0, 89.5)))
    assert verdicts(f) == [None, None, None]
    assert all("every run is at chance (90% error)" in x.evidence for x in f)
    one = lars.findings(lars_runs([10.0], [30.0], [10.0], [30.0]))
    assert verdicts(one) == [None, None, None]
    assert all("one seed per arm" in x.evidence for x in one)


def test_a_diverged_lars_run_counts_as_full_error():
    df = lars_runs(GOOD, BAD, GOOD, BAD)
    df.loc[(df["optimizer"] == "lars") & (df["k"] == 128.0), "status"] = "diverged"
    f = lars.findings(df)
    assert f[0].replayed is False and "LARS 100.0% vs SGD 31.0%" in f[0].evidence


def test_lars_loses_less_from_the_smallest_to_the_largest_k():
    # change: LARS +6 (5 -> 11), SGD +28 (3 -> 31); spread at k = 128 is 1
    f = lars.findings(lars_runs(GOOD, BAD, GOOD, BAD))[2]
    assert f.claim == "from k=4 to k=128 LARS loses less accuracy than SGD (resnet)"
    assert f.replayed is True and "LARS +6.0 points, SGD +28.0 points" in f.evidence
    assert "AlexNet-BN from 512 to 8192: LARS +0.1 points, SGD +2.2 points" in f.evidence
    # LARS +36, SGD +28: it loses more
    assert lars.findings(lars_runs([40.0, 41.0, 42.0], BAD, GOOD, BAD))[2].replayed is False
    # LARS +30 vs SGD +28 on the same seeds, per-seed differences -7, +2, +11: spread 9
    f = lars.findings(lars_runs([25.0, 35.0, 45.0], BAD, GOOD, BAD))[2]
    assert f.replayed is None
    assert "inside the seed spread (9.00 points, standard deviation of the per-seed" in f.evidence


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


def test_bn_decay_finding_replayed_not_replayed_undecided():
    (f,) = bn_decay.findings(decay_runs(GOOD, BAD))
    assert f.replayed is True
    assert (
        "k=128: no decay 11.0% vs decay 31.0% error (mean of 3; no decay better in 3 of 3"
        in f.evidence
    )
    assert "ResNet-50 71.9 to 76.2 (error 28.1 to 23.8), AlexNet 55.8 to 57.1" in f.evidence
    assert bn_decay.findings(decay_runs(BAD, GOOD))[0].replayed is False
    assert bn_decay.findings(decay_runs([10.0, 20.0, 30.0], [21.0, 22.0, 23.0]))[0].replayed is None
    at_chance = bn_decay.findings(decay_runs([88.0, 89.0], [90.0, 91.0]))[0]
    assert at_chance.replayed is None and "at chance" in at_chance.evidence


def test_bn_decay_runs_and_table():
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
    # the no-decay runs are notebook 6's LARS runs at that k (the same experiment keys)
    six = [
        r
        for r in lars.runs(CPU, [0, 1, 2])
        if r.get("optimizer") == "lars" and r["batch_size"] == 2048
    ]
    assert [{**r, "decay_bn_bias": False} for r in six] == [
        r for r in runs if not r["decay_bn_bias"]
    ]
    assert len(bn_decay.runs(SMOKE, [0])) == 2
    valid(runs, "bn_decay")

    t = bn_decay.table(decay_runs(GOOD, BAD))
    assert list(t["decay_bn_bias"]) == [True, False]  # the paper's order: with decay first
    assert list(t["paper_top1_acc_pct"]) == [71.9, 76.2]
    assert list(t["final_top1_error_pct_mean"]) == [31.0, 11.0]


# -- 8. pool5-BN -------------------------------------------------------------------------------


def pool5_runs(bn, none, decay, loss_none=0.5) -> pd.DataFrame:
    rows = [
        *by_seed(bn, decay_bn_bias=False, pool5_bn=True),
        *by_seed(none, decay_bn_bias=False, pool5_bn=False, final_train_loss=loss_none),
        *by_seed(decay, decay_bn_bias=True, pool5_bn=False),
    ]
    return frame(rows, model="alexnet", optimizer="lars", k=64.0, lr=16.0)


def test_pool5_bn_findings_replayed_not_replayed_undecided():
    f = pool5_bn.findings(pool5_runs(GOOD, BAD, [50.0, 51.0, 52.0]))
    assert verdicts(f) == [True, True]
    assert "pool5-BN 11.0% vs none 31.0%" in f[0].evidence
    assert "Jia et al. accuracy 57.1 to 58.8" in f[0].evidence
    assert "not replayed" not in f[1].evidence

    f = pool5_bn.findings(pool5_runs(BAD, GOOD, [1.0, 2.0, 3.0]))
    assert verdicts(f) == [False, False]
    # why the decay finding fails here, in words: the biases leave LARS
    assert "not replayed at this scale: without decay the biases of plain AlexNet" in f[1].evidence
    assert (
        "raw global lr 16" in f[1].evidence and "training loss 0.50 without decay" in f[1].evidence
    )

    f = pool5_bn.findings(pool5_runs([10.0, 20.0, 30.0], [19.0, 21.0, 23.0], [22.0, 18.0, 20.0]))
    assert verdicts(f) == [None, None]
    assert "inside the seed spread" in f[0].evidence and "inside the seed spread" in f[1].evidence


def test_pool5_bn_at_chance_is_undecided_and_says_the_runs_did_not_train():
    chance = [89.0, 90.0, 91.0]
    f = pool5_bn.findings(pool5_runs(chance, chance, chance, loss_none=2.31))
    assert verdicts(f) == [None, None]
    assert "did not train" in f[1].evidence and f[1].evidence.endswith("at chance (90% error)")
    # the committed cpu replay: pool5-BN learned, the no-decay runs stayed at chance
    f = pool5_bn.findings(
        pool5_runs([50.0, 55.0, 69.0], [90.0] * 3, [76.0, 84.0, 89.0], loss_none=2.30)
    )
    assert f[0].replayed is True and f[1].replayed is False
    assert "they did not train" in f[1].evidence


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


def test_half_precision_reaches_fp32_judged_by_fp32s_seed_spread():
    fp32 = [4.0, 5.0, 6.0]  # spread 1
    # one seed each (the cpu profile): 4.2 vs fp32's seed 0 (4.0): 0.2 above, 1.3 inside 1.5
    f = mixed_precision.findings(precision_runs(fp32, [4.2], [8.0]))
    assert f[0].claim.startswith("fp16") and f[1].claim.startswith("bf16")
    assert verdicts(f)[:2] == [True, False]
    assert "fp16 4.2% vs fp32 4.0% error at k=16 (mean of the same 1 seeds" in f[0].evidence
    assert "judged by fp32's seed spread over 3 seeds" in f[0].evidence
    assert "76.2% accuracy with LARS" in f[0].evidence
    # 1.0 above: 0.5 from the threshold, inside fp32's spread
    assert mixed_precision.findings(precision_runs(fp32, [5.0], [4.0]))[0].replayed is None
    # fp32 on one seed too: no spread to judge by
    one = mixed_precision.findings(precision_runs([4.0], [4.2], [4.1]))
    assert verdicts(one)[:2] == [None, None] and "one seed per arm" in one[0].evidence
    chance = mixed_precision.findings(precision_runs([89.0, 90.0, 91.0], [90.5], [89.5]))
    assert verdicts(chance)[:2] == [None, None] and "at chance" in chance[0].evidence


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
        "Jia et al. (talk): AlexNet accuracy 55.8% with vs 57.1% without weight decay on bias and "
        "BN (no pool5-BN; 64k, LARS)",
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
