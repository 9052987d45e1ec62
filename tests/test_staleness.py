"""Simulated asynchronous SGD with bounded staleness (lbsgd.staleness; Lian et al. 2015).

The property protected: the update of step t applies the gradient computed on W_{t−τ} (W_0 while
t < τ) to W_t, with τ fixed or drawn from a pure function of (seed, step, worker); τ = 0 is today's
synchronous run to the bit; ``fixed`` does not depend on the layout; the ring of past weights is in
the checkpoint, so a killed run resumes bitwise.
"""

import pytest
import torch
from conftest import TINY, lbsgd
from helpers import SIX_STEP_ARGS, assert_bitwise, killed_and_resumed
from torch.optim.optimizer import register_optimizer_step_pre_hook

from lbsgd import checkpoint, register_model
from lbsgd.config import Config, ConfigError, from_dict
from lbsgd.entry import train
from lbsgd.staleness import StaleWeights, draw

# -- the draw ---------------------------------------------------------------------------------


def test_uniform_draws_are_repeatable_in_range_and_differ_between_workers():
    draws = {(s, t, w): draw(s, t, w, 4) for s in (0, 1) for t in range(50) for w in range(4)}
    assert draws == {(s, t, w): draw(s, t, w, 4) for (s, t, w) in draws}  # a pure function
    assert set(draws.values()) == {0, 1, 2, 3, 4}  # every tau in {0, ..., tau_max} occurs
    for s in (0, 1):  # the simulated workers of one step draw independently
        per_worker = [[draws[s, t, w] for t in range(50)] for w in range(4)]
        assert all(per_worker[a] != per_worker[b] for a in range(4) for b in range(a + 1, 4))
    assert [draws[0, t, 0] for t in range(50)] != [draws[1, t, 0] for t in range(50)]  # seed
    counts = torch.bincount(torch.tensor([draw(0, t, 0, 4) for t in range(5000)]), minlength=5)
    # 1000 each: ±100 is 3.5 standard deviations of a binomial(5000, 1/5)
    assert counts.min() > 900 and counts.max() < 1100


# -- the mechanics on a hand-computed example ---------------------------------------------------


def test_one_step_stale_sgd_follows_the_hand_computed_sequence():
    """τ = 1 fixed, plain SGD (η = 1/4) on y = w·x with L = ½(w·x − y)², ∇L = (w·x − y)·x, from
    w_0 = 1 on the batches (x, y) = (1, 3), (2, 0), (1, 1); w_{t+1} = w_t − η ∇L(w_{t−1}; batch_t):
        t=0: ∇L(w_0 = 1;   (1, 3)) = −2   -> w_1 = 1 + 1/2       = 1.5
        t=1: ∇L(w_0 = 1;   (2, 0)) =  4   -> w_2 = 1.5 − 1       = 0.5
        t=2: ∇L(w_1 = 1.5; (1, 1)) =  0.5 -> w_3 = 0.5 − 1/8     = 0.375
    (synchronous SGD would give 1.5, 0, 0.25)."""
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    stale = StaleWeights(list(model.parameters()), tau_max=1, dist="fixed", seed=0)
    seen, got = [], []
    for t, (x, y) in enumerate([(1.0, 3.0), (2.0, 0.0), (1.0, 1.0)]):
        stale.begin(t)  # the trainer's sequence: begin, use per micro-batch, restore, step
        assert stale.use(worker=0) == 1
        seen.append(model.weight.item())
        loss = 0.5 * (model(torch.tensor([[x]])) - y).pow(2).sum()
        loss.backward()
        stale.restore()
        opt.step()
        opt.zero_grad()
        got.append(model.weight.item())
    assert seen == [1.0, 1.0, 1.5]  # the weights each gradient was computed on: w_0, w_0, w_1
    assert got == [1.5, 0.5, 0.375]


def test_a_checkpoint_without_the_ring_is_refused_with_one_line():
    stale = StaleWeights([torch.zeros(3)], tau_max=2, dist="uniform", seed=0)
    for saved in (None, {"tau_max": 1, "held": [0, 1], "slots": [[torch.zeros(3)]] * 2}):
        with pytest.raises(ConfigError, match="staleness=2: ck.pt holds no ring") as e:
            stale.load_state_dict(saved, "ck.pt")
        assert "\n" not in str(e.value)


# -- in the trainer -------------------------------------------------------------------------------

SEEN: list[torch.Tensor] = []  # the weight matrix of every training forward, in order
STEPPED: list[torch.Tensor] = []  # the weight matrix the optimizer stepped, per step: W_t
BUILT: list[torch.nn.Module] = []


class _Recording(torch.nn.Module):
    def __init__(self, inputs: int, classes: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:  # evaluation passes are not gradients
            SEEN.append(self.fc.weight.detach().clone())
        return self.fc(x.flatten(1))


@register_model("test_staleness_recording_linear")
def _recording_linear(cfg, num_classes, image_size):
    BUILT.append(_Recording(3 * image_size**2, num_classes))
    return BUILT[-1]


@pytest.mark.parametrize("dist", ["fixed", "uniform"])
def test_trainer_computes_each_gradient_on_the_weights_tau_steps_old(tiny, dist):
    """8 steps of 4 micro-batches (4 simulated workers with ``uniform``), τ_max = 2: the forward of
    micro-batch i at step t sees W_{max(t − τ, 0)} and the optimizer steps W_t."""
    for record in (SEEN, STEPPED, BUILT):
        record.clear()
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: STEPPED.append(BUILT[-1].fc.weight.detach().clone())
    )
    try:
        cfg = tiny(
            model="test_staleness_recording_linear",
            micro_batch=16,
            epochs=1,
            staleness=2,
            staleness_dist=dist,
        )
        assert train(cfg)["status"] == "completed"
    finally:
        handle.remove()
    assert len(STEPPED) == 8 and len(SEEN) == 8 * 4
    assert not torch.equal(STEPPED[0], STEPPED[7])  # the weights did move
    taus = []
    for t in range(8):
        for i in range(4):
            tau = 2 if dist == "fixed" else draw(cfg.seed, t, i, 2)
            assert torch.equal(SEEN[4 * t + i], STEPPED[max(t - tau, 0)]), (t, i, tau)
            taus.append(tau)
    if dist == "uniform":
        assert set(taus) == {0, 1, 2}


def test_staleness_zero_trains_bitwise_like_a_run_without_the_key(tiny):
    plain, zero = tiny(name="plain", epochs=1), tiny(name="zero", epochs=1, staleness=0)
    assert Config(**TINY).run_name() == Config(**TINY, staleness=0).run_name()  # same run names
    assert Config(**TINY).run_name() != Config(**TINY, staleness=1).run_name()
    for cfg in (plain, zero):
        assert train(cfg)["status"] == "completed"
    assert_bitwise(
        checkpoint.load(zero.run_dir())["model"], checkpoint.load(plain.run_dir())["model"]
    )
    stale = tiny(name="stale", epochs=1, staleness=1)  # the key does act when it is not 0
    train(stale)
    moved, want = (
        checkpoint.load(stale.run_dir())["model"],
        checkpoint.load(plain.run_dir())["model"],
    )
    assert not torch.equal(moved["fc.weight"], want["fc.weight"])


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"staleness": -1}, "staleness=-1 must be >= 0 (0 = synchronous)"),
        ({"staleness": 2, "staleness_dist": "gaussian"}, "staleness_dist='gaussian'"),
        (
            {"staleness": 2, "local_sgd": 4},
            "staleness=2 delays the gradients of synchronous steps: not with local_sgd=4 "
            "(valid: local_sgd=0)",
        ),
    ],
    ids=["negative", "unknown_distribution", "local_sgd"],
)
def test_bad_staleness_input_is_refused_with_one_line(keys, message):
    with pytest.raises(ConfigError) as e:
        from_dict(keys)
    assert message in str(e.value) and "\n" not in str(e.value)


# -- processes and resume (gloo on CPU) -----------------------------------------------------------


@pytest.mark.slow
def test_fixed_staleness_two_processes_equal_one_process_accumulating(tmp_path):
    """τ = 2 fixed is one τ per step: 2 processes × micro-batch 16 and 1 process accumulating
    2 × 16 compute every gradient on the same old weights (same ring on every process) and end
    with the same weights and BN statistics, up to float reordering (tests/test_distributed.py)."""
    keys = [k if not k.startswith("bn_batch") else "bn_batch=8" for k in SIX_STEP_ARGS]
    keys += ["micro_batch=16", "staleness=2", f"out_dir={tmp_path}"]
    r = lbsgd(["train", *keys, "name=two"], nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    r = lbsgd(["train", *keys, "name=one"])
    assert r.returncode == 0, r.stderr[-3000:]
    r = lbsgd(["train", *[k for k in keys if k != "staleness=2"], "name=sync"])
    assert r.returncode == 0, r.stderr[-3000:]
    one, two, sync = (
        checkpoint.load(tmp_path / "runs" / n)["model"] for n in ("one", "two", "sync")
    )
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert any((one[k] - sync[k]).abs().max() > 1e-3 for k in one if one[k].is_floating_point())


@pytest.mark.slow
def test_two_processes_killed_mid_run_resume_to_bitwise_equal_weights(tmp_path):
    """uniform τ ≤ 2 (a draw per rank: one micro-batch each), 2 gloo processes, rank 1 killed
    before step 11: the checkpoint of step 9 holds the ring W_6, W_7, W_8 once, and the resumed
    group ends bitwise where the uninterrupted one does."""
    saved = killed_and_resumed(tmp_path, "two", nproc=2, staleness=2, staleness_dist="uniform")
    assert sorted(saved["staleness"]["held"]) == [6, 7, 8]
    assert all("staleness" not in rank for rank in saved["ranks"])  # once, not per process


def test_cli_refuses_staleness_with_local_sgd_in_one_line_and_writes_nothing(tmp_path):
    r = lbsgd(["train", "staleness=1", "local_sgd=2", f"out_dir={tmp_path}"])
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "not with local_sgd=2" in r.stderr
    assert list(tmp_path.iterdir()) == []
