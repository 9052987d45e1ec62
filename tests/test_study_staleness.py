"""Study 13 (lbsgd.lab.studies.staleness) on hand-made runs: the run lists of the cpu and smoke
profiles (valid configs with their process layouts), and each finding replayed, not replayed,
undecided and invalid."""

import pandas as pd
import pytest
from helpers import run_name, valid_layout

from lbsgd import config
from lbsgd.lab.studies import batch_scaling, scales
from lbsgd.lab.studies import staleness as st

CPU, SMOKE = scales.get("cpu"), scales.get("smoke")


# -- the runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", [CPU, SMOKE], ids=["cpu", "smoke"])
def test_staleness_runs_are_valid_and_tau_0_linear_is_notebook_3s_run(profile):
    seeds = list(profile.seeds)
    runs = st.runs(profile, seeds)
    assert len(runs) == len(st.TAUS) * len(st.RULES) * len(seeds)
    assert {r["staleness"] for r in runs} == set(st.TAUS)
    assert {r["staleness_dist"] for r in runs} == {"fixed"}
    assert len({run_name(r) for r in runs}) == len(runs)
    for r in runs:
        valid_layout(r, 1)
    base = [r for r in runs if r["staleness"] == 0 and r["lr_scaling"] == "linear"]
    same = batch_scaling.runs(profile, seeds, [profile.large_k])
    assert [run_name(r) for r in base] == [run_name(r) for r in same]
    # the two rules differ in the peak lr by k
    lin, none = (
        valid_layout(next(r for r in runs if r["lr_scaling"] == x), 1).lr
        for x in ("linear", "none")
    )
    assert lin == pytest.approx(none * profile.large_k)


@pytest.mark.parametrize("profile", [CPU, SMOKE], ids=["cpu", "smoke"])
def test_ps_runs_name_their_workers_and_do_not_resume(profile):
    runs = st.ps_runs(profile, list(profile.seeds), workers=2)
    for r in runs:
        assert r["async_ps"] is True and r["resume"] is False
        assert r["name"].endswith("-ps2")
        cfg = config.from_dict({**r, "study": "x"})
        assert cfg.async_ps and not cfg.resume
        config.derive(cfg, 3, r["synthetic_train"])  # 1 server + 2 workers
    assert {r["name"] for r in runs}.isdisjoint(r["name"] for r in st.ps_runs(profile, [0], 1))
    with pytest.raises(config.ConfigError, match=r"^workers=0 must be an integer >= 1"):
        st.ps_runs(profile, [0], workers=0)


# -- hand-made runs ----------------------------------------------------------------------------


def sim(errors, seeds=(0, 1, 2), diverged=()):
    """``errors[rule][tau]``: errors per seed; ``diverged``: (rule, tau, seed) that diverged."""
    rows = []
    for rule, by_tau in errors.items():
        for tau, errs in by_tau.items():
            for s, e in zip(seeds, errs, strict=True):
                rows.append(
                    {
                        "lr_scaling": rule,
                        "staleness": tau,
                        "seed": s,
                        "k": 16.0,
                        "lr": 0.2 if rule == "linear" else 0.0125,
                        "dataset": "synthetic",
                        "final_top1_error_pct": e,
                        "status": "diverged" if (rule, tau, s) in diverged else "completed",
                    }
                )
    return pd.DataFrame(rows)


def ps(errors, means, seeds=(0, 1, 2)):
    return pd.DataFrame(
        {
            "seed": list(seeds),
            "final_top1_error_pct": errors,
            st.STALENESS_MEAN: means,
            "async_ps_workers": 2,
            "lr_scaling": "linear",
            "k": 16.0,
            "lr": 0.2,
            "status": "completed",
            "dataset": "synthetic",
        }
    )


GROWS = {
    "linear": {0: [5, 5.2, 4.8], 1: [5.5, 5.6, 5.4], 8: [9, 9.3, 8.7]},
    "none": {0: [8, 8.2, 7.8], 1: [8, 8.2, 7.8], 8: [8.5, 8.6, 8.4]},
}


def test_staleness_findings_replayed_on_a_clear_table():
    f = st.findings(sim(GROWS), ps([5.6, 5.5, 5.4], [0.9, 1.1, 1.0]))
    assert [x.replayed for x in f] == [True, True, True], [x.evidence for x in f]
    assert "τ=8: 9.00%" in f[0].evidence
    assert "linear +4.00, +4.10, +3.90" in f[1].evidence
    assert "→ τ = 1" in f[2].evidence and "PS 5.50% vs simulated 5.50%" in f[2].evidence


def test_staleness_findings_not_replayed_when_tau_does_not_hurt():
    flat = {
        "linear": {0: [5, 5.2, 4.8], 8: [4, 4.1, 3.9]},
        "none": {0: [8, 8.2, 7.8], 8: [10, 10.2, 9.8]},
    }
    # the PS runs 3, 3.1, 2.9 points above the simulated τ = 0: the interval wholly beyond +1
    f = st.findings(sim(flat), ps([8, 8.3, 7.7], [0.2, 0.1, 0.3]))
    assert [x.replayed for x in f] == [False, False, False], [x.evidence for x in f]
    assert "not replayed at this scale" in f[0].evidence
    assert "a distribution" in f[2].evidence


def test_staleness_findings_undecided_when_the_interval_crosses_zero_one_seed_or_without_ps():
    # τ = 8 minus τ = 0 per seed: +1, −3, +4 (interval [−8.1, +9.4]); growths linear minus none:
    # −1, 0, +1 (interval [−2.5, +2.5]): both reach across 0
    noisy = {"linear": {0: [5, 7, 3], 8: [6, 4, 7]}, "none": {0: [5, 7, 3], 8: [7, 4, 6]}}
    f = st.findings(sim(noisy))
    assert [x.outcome for x in f] == ["undecided"] * 3, [x.evidence for x in f]
    assert "undecided: the interval reaches across the threshold +0" in f[0].evidence
    assert "undecided: the interval reaches across the threshold +0" in f[1].evidence
    assert "undecided: no parameter-server run" in f[2].evidence
    one = st.findings(
        sim({r: {t: v[:1] for t, v in d.items()} for r, d in GROWS.items()}, seeds=(0,))
    )
    assert [x.outcome for x in one[:2]] == ["undecided"] * 2
    assert all("undecided: one run per arm" in x.evidence for x in one[:2])
    # no simulated run at the PS runs' staleness
    far = st.findings(sim(GROWS), ps([5, 5, 5], [3.9, 4.1, 4.0]))[2]
    assert far.replayed is None and "no simulated run at τ = 4" in far.evidence


def test_the_rules_growths_do_not_compare_when_one_arm_hardly_trains():
    """Without the linear rule the lr can be too small to train in the budget (cpu: 79% at
    tau = 0 vs 5% with it): its flat curve is no evidence that the rule amplifies staleness."""
    under = {"linear": GROWS["linear"], "none": {0: [79, 79.5, 78.5], 8: [80, 80.5, 79.5]}}
    f = st.findings(sim(under))[1]
    assert f.replayed is None and f.invalid, f.evidence
    assert "invalid: at τ = 0 the arms already differ by 74.0 points" in f.evidence
    assert "hardly trains in this budget" in f.evidence
    # the same growths with both arms trained (5% and 8% at τ = 0): replayed
    assert st.findings(sim(GROWS))[1].outcome == "replayed"


def test_every_claim_on_the_simulation_is_invalid_when_every_run_is_at_chance():
    at_chance = {
        "linear": {0: [88, 89, 90], 8: [89, 90, 91]},
        "none": {0: [88, 89, 90], 8: [89, 90, 91]},
    }
    f = st.findings(sim(at_chance))
    assert [x.outcome for x in f[:2]] == ["invalid", "invalid"], [x.evidence for x in f]
    assert all(x.replayed is None and x.p is None for x in f[:2])
    assert "invalid: an arm did not train" in f[0].evidence
    assert "invalid: every run is at chance (90% error)" in f[1].evidence


def test_error_grows_is_invalid_when_the_top_tau_arm_is_at_chance():
    """τ = 8 at 88-90% error (chance 90%): that arm did not train, so the comparison with τ = 0
    says nothing of staleness, although its error is far above τ = 0's."""
    top_at_chance = {**GROWS, "linear": {0: [5, 5.2, 4.8], 8: [88, 89, 90]}}
    f = st.findings(sim(top_at_chance))[0]
    assert f.replayed is None and f.invalid and f.outcome == "invalid", f.evidence
    assert "invalid: an arm did not train (its mean error 89.0% is within 5 points of " in (
        f.evidence
    )
    assert "chance (90%)" in f.evidence and f.p is None
    # τ = 8 at 60%: trained (25 points from chance), and clearly worse than τ = 0: replayed
    trained = {**GROWS, "linear": {0: [5, 5.2, 4.8], 8: [60, 61, 59]}}
    assert st.findings(sim(trained))[0].outcome == "replayed"


def test_a_diverged_stale_run_counts_as_100_percent_and_makes_the_comparison_invalid():
    div = {"linear": {0: [5, 5.2, 4.8], 8: [6, 6, 6]}, "none": {0: [20, 20, 20], 8: [20, 20, 20]}}
    # without the divergence τ = 8 is 1, 0.8, 1.2 points above τ = 0 (interval [+0.5, +1.5])
    assert st.findings(sim(div))[0].outcome == "replayed"
    f = st.findings(sim(div, diverged={("linear", 8, 0)}))[0]
    assert f.replayed is None and f.invalid and f.outcome == "invalid", f.evidence
    assert "1 diverged run(s) counted as 100%" in f.evidence
    assert "invalid: an arm did not train (1 of its 3 runs diverged)" in f.evidence
    assert "τ=8: 37.33%" in f.evidence  # (100 + 6 + 6) / 3
    t = st.table(sim(div, diverged={("linear", 8, 0)}))
    row = t[(t["lr_scaling"] == "linear") & (t["staleness"] == 8)].iloc[0]
    assert row["diverged"] == 1 and row["final_top1_error_pct_mean"] == pytest.approx(112 / 3)


def test_the_server_beside_the_simulation_is_a_two_sided_equivalence():
    """Claim 3 against the simulated τ = 1 (linear: 5.5, 5.6, 5.4)."""
    # 0.2, 0.3, 0.2 points above: the interval [+0.09, +0.38] inside ±1
    above = st.findings(sim(GROWS), ps([5.7, 5.9, 5.6], [0.9, 1.1, 1.0]))[2]
    assert above.outcome == "replayed", above.evidence
    # 3, 2.9, 3.1 points below: the interval wholly below −1, so not within 1 point either way
    below = st.findings(sim(GROWS), ps([2.5, 2.7, 2.3], [0.9, 1.1, 1.0]))[2]
    assert below.outcome == "not replayed", below.evidence
    assert "Δ -3.00 points" in below.evidence and "not replayed at this scale" in below.evidence
    # 0, +3, −2 points: the interval reaches across the margin
    noisy = st.findings(sim(GROWS), ps([5.5, 8.6, 3.4], [0.9, 1.1, 1.0]))[2]
    assert noisy.outcome == "undecided", noisy.evidence
    assert "undecided: the interval reaches across the margin ±1" in noisy.evidence
    # a diverged PS run counts as 100%: the comparison is invalid
    crashed = ps([5.7, 5.9, 5.6], [0.9, 1.1, 1.0]).assign(
        status=["completed", "diverged", "completed"]
    )
    f = st.findings(sim(GROWS), crashed)[2]
    assert f.outcome == "invalid" and f.replayed is None, f.evidence
    assert "invalid: an arm did not train (1 of its 3 runs diverged)" in f.evidence


def test_staleness_table_sets_zhangs_lr_factor_beside_the_rules():
    t = st.table(sim(GROWS), ps([5.6, 5.5, 5.4], [0.9, 1.1, 1.0]))
    simulated = t[t["mode"] == "simulated"]
    assert simulated["paper_lr_factor"].tolist() == [1.0, 1.0, 1 / 8] * 2
    assert set(simulated[simulated["lr_scaling"] == "linear"]["lr_factor"]) == {16.0}
    assert set(simulated[simulated["lr_scaling"] == "none"]["lr_factor"]) == {1.0}
    server = t[t["mode"] == "async_ps"]
    assert server["runs"].tolist() == [3] and server["staleness"].tolist() == [pytest.approx(1.0)]
    assert st.matched_tau(ps([5, 5, 5], [1.4, 1.6, 1.5])) == 2


# -- what the papers report, beside every finding ---------------------------------------------


def test_every_finding_of_study_13_carries_what_the_papers_report():
    stale = [
        "Lian et al. 2015: qualitative, convergence needs a step size that shrinks as the "
        "staleness bound grows; no number in the reference data",
        "Lian et al. 2015, Zhang et al. 2016: qualitative, the step size bounded by the staleness "
        "(Lian) or divided by it, η/τ (Zhang); no number in the reference data",
        "no published number: lbsgd's parameter server against its own simulation of staleness",
    ]
    assert [f.paper for f in st.findings(sim(GROWS), ps([5.6, 5.5, 5.4], [0.9, 1.1, 1.0]))] == stale
    assert [f.paper for f in st.findings(sim(GROWS))] == stale  # no PS run
    assert [f.paper for f in st.findings(sim(GROWS), ps([5, 5, 5], [3.9, 4.1, 4.0]))] == stale
