"""BMUF (Chen & Huo 2016, Algorithm 1; lbsgd.comm.BMUF): the filter, its blocks, its keys, and
2-process gloo runs.

The filter is checked on small float64 tensors against values computed by hand (every number a
short binary fraction, so that the comparison is exact), with K = 2 simulated processes and a fake
all-reduce; then in the trainer: η_B = 0, ε_B = 1 and n = 1 with plain SGD ends with synchronous
SGD's weights (parameters averaged after every step of plain SGD = gradients averaged, to float
rounding), the first block of a 2-process run is the filtered average of post-local SGD's first
block, and a run killed mid-training resumes to bitwise the uninterrupted weights.

Run as a script (under torchrun), this file is ``python -m lbsgd`` with BMUF's filter forced on
even at η_B = 0, ε_B = 1 (where the trainer otherwise keeps torch's averager).
"""

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY, lbsgd
from helpers import SIX_STEP_ARGS, killed_and_resumed, run_fault_worker

from lbsgd import checkpoint, comm
from lbsgd.config import HASHED_ONLY_OFF_DEFAULT, Config, ConfigError, from_dict
from lbsgd.config.step_features import bmuf_filters

HERE = Path(__file__).parent
F64 = torch.float64


class Workers:
    """K simulated processes, each with its own parameters (one 2-vector) and its own BMUF. The
    fake all-reduce returns the mean of what every process held when the step ended, as a real
    all-reduce does (all processes contribute before any restarts)."""

    def __init__(
        self,
        k: int,
        start: int,
        period: int,
        eta: float,
        eps: float,
        nesterov: bool,
        init: list[float],
    ) -> None:
        self.params = [[torch.nn.Parameter(torch.tensor(init, dtype=F64))] for _ in range(k)]
        self.held: list[torch.Tensor] = []
        self.averaged = 0  # all-reduces so far
        self.bmuf = [
            comm.BMUF(
                period=period,
                start=start,
                step=0,
                params=p,
                block_momentum=eta,
                block_lr=eps,
                nesterov=nesterov,
                average=self.average,
            )
            for p in self.params
        ]

    def average(self, flat: torch.Tensor) -> torch.Tensor:
        assert any(torch.equal(flat, h) for h in self.held)  # its own parameters, flat
        self.averaged += 1
        return torch.stack(self.held).mean(0)

    def step(self, *moves: list[float]) -> None:
        """One optimizer step: process k's parameters move by ``moves[k]``; then after_step."""
        with torch.no_grad():
            for p, move in zip(self.params, moves, strict=True):
                p[0].add_(torch.tensor(move, dtype=F64))
        self.held = [p[0].detach().clone() for p in self.params]
        for bmuf, p in zip(self.bmuf, self.params, strict=True):
            bmuf.after_step(p)

    def weights(self) -> list[list[float]]:
        return [p[0].tolist() for p in self.params]


@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov_NBM", "classical_CBM"])
def test_filter_over_two_blocks_equals_the_hand_computed_update(nesterov):
    """η_B = 0.5, ε_B = 0.75, K = 2, n = 2, local phase from step 1 (the first block is one step,
    as torch's averager places it; the second is steps 2 and 3).

    W(0) = W_g(0) = [1, 2] after synchronous step 0. Block 1: the processes reach [1.5, 1] and
    [2.5, 2]: W̄ = [2, 1.5], G = [1, -0.5], Δ(1) = 0.75 G = [0.75, -0.375], W(1) = [1.75, 1.625],
    W_g(1) = W(1) + 0.5 Δ(1) = [2.125, 1.4375] (NBM) or W(1) (CBM). Block 2: the processes move by
    [-0.5, 0.5] and [1, 0.5] from W_g(1): G = [0.25, 0.5], Δ(2) = 0.5 Δ(1) + 0.75 G =
    [0.5625, 0.1875], W(2) = [2.3125, 1.8125], W_g(2) = [2.59375, 1.90625] (NBM) or W(2) (CBM)."""
    w = Workers(2, start=1, period=2, eta=0.5, eps=0.75, nesterov=nesterov, init=[0.5, 1.5])
    w.step([0.5, 0.5], [0.5, 0.5])  # synchronous: the same update on both processes
    assert w.averaged == 0 and w.bmuf[0].global_model.tolist() == [1.0, 2.0]
    w.step([0.5, -1.0], [1.5, 0.0])  # block 1 ends
    start_1 = [2.125, 1.4375] if nesterov else [1.75, 1.625]
    assert w.averaged == 2 and w.weights() == [start_1, start_1]
    for b in w.bmuf:
        assert b.delta.tolist() == [0.75, -0.375] and b.global_model.tolist() == [1.75, 1.625]
    w.step([-1.0, 0.5], [0.0, 1.0])  # inside block 2: no all-reduce, no filter
    assert w.averaged == 2 and w.weights()[0] != w.weights()[1]
    w.step([0.5, 0.0], [1.0, -0.5])  # block 2 ends
    start_2 = [2.59375, 1.90625] if nesterov else [2.3125, 1.8125]
    assert w.averaged == 4 and w.weights() == [start_2, start_2]
    for b in w.bmuf:
        assert b.delta.tolist() == [0.5625, 0.1875] and b.global_model.tolist() == [2.3125, 1.8125]


def test_zero_block_momentum_and_unit_block_lr_is_plain_model_averaging():
    torch.manual_seed(0)
    init = torch.randn(5).tolist()
    w = Workers(2, start=0, period=1, eta=0.0, eps=1.0, nesterov=True, init=init)
    for _ in range(3):
        moves = torch.randn(2, 5).tolist()
        mean = torch.stack(
            [
                p[0].detach() + torch.tensor(m, dtype=F64)
                for p, m in zip(w.params, moves, strict=True)
            ]
        ).mean(0)
        w.step(*moves)
        for p in w.params:
            torch.testing.assert_close(p[0].detach(), mean, rtol=0, atol=1e-12)
    assert not bmuf_filters(Config())  # the trainer runs torch's averager then
    assert bmuf_filters(Config(local_sgd=2, block_momentum=0.5))
    assert bmuf_filters(Config(local_sgd=2, block_lr=0.5))


def test_blocks_end_where_post_local_sgd_averages():
    """The first local step closes a block, then every n-th (where torch's PeriodicModelAverager
    averages for post-local SGD), and a block end is exactly where in_sync says the processes
    hold the same model (the trainer's checkpoint rule)."""
    start, period = 2, 3
    w = Workers(2, start=start, period=period, eta=0.5, eps=1.0, nesterov=True, init=[0.0])
    ends = []
    for step in range(12):
        before = w.averaged
        w.step([0.25], [0.5])
        if w.averaged > before:
            ends.append(step)
    assert ends == [2, 5, 8, 11]
    assert ends == [s for s in range(start, 12) if w.bmuf[0].in_sync(s)]


def test_state_dict_resumes_the_filter_bitwise():
    """A BMUF rebuilt at step 5 (mid-block) from another's state continues bitwise like it; K = 1,
    where the filter still applies (W̄ = W_1)."""
    torch.manual_seed(1)
    moves = torch.randn(9, 4, dtype=F64)

    def fresh(step, p):
        return comm.BMUF(
            period=3,
            start=2,
            step=step,
            params=p,
            block_momentum=0.7,
            block_lr=1.3,
            nesterov=True,
            average=lambda flat: flat,
        )

    p = [torch.nn.Parameter(torch.zeros(4, dtype=F64))]
    a = fresh(0, p)
    for m in moves[:5]:
        with torch.no_grad():
            p[0].add_(m)
        a.after_step(p)
    q = [torch.nn.Parameter(p[0].detach().clone())]
    b = fresh(5, q)
    b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
    for m in moves[5:]:
        for bmuf, params in ((a, p), (b, q)):
            with torch.no_grad():
                params[0].add_(m)
            bmuf.after_step(params)
    assert torch.equal(p[0], q[0]) and torch.equal(a.delta, b.delta)
    assert a.delta.abs().max() > 0  # the filter ran (blocks ended after steps 2, 5 and 8)
    plain = moves.sum(0)  # no filter: the sum of the moves
    assert not torch.allclose(p[0].detach(), plain)


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"local_sgd": 2, "block_momentum": 1.0}, r"^block_momentum=1\.0.*must be in \[0, 1\)"),
        ({"local_sgd": 2, "block_momentum": -0.1}, r"^block_momentum=-0\.1.*must be in \[0, 1\)"),
        ({"local_sgd": 2, "block_momentum": math.nan}, r"^block_momentum=nan must be a finite"),
        ({"local_sgd": 2, "block_lr": 0.0}, r"^block_lr=0\.0.*finite number > 0"),
        ({"local_sgd": 2, "block_lr": math.inf}, r"^block_lr=inf must be a finite number"),
        ({"block_momentum": 0.9}, r"^block_momentum=0\.9 has no effect unless local_sgd > 0"),
        ({"block_lr": 2.0}, r"^block_lr=2\.0 has no effect unless local_sgd > 0"),
        ({"block_nesterov": False}, r"^block_nesterov=False has no effect unless local_sgd > 0"),
        ({"local_sgd": 2, "block_lr": "fast"}, r"^block_lr='fast'"),
    ],
    ids=[
        "momentum_1",
        "momentum_negative",
        "momentum_nan",
        "lr_0",
        "lr_inf",
        "momentum_without_local_sgd",
        "lr_without_local_sgd",
        "classical_without_local_sgd",
        "lr_not_a_number",
    ],
)
def test_bad_bmuf_keys_are_refused_in_one_line(keys, match):
    with pytest.raises(ConfigError, match=match) as e:
        from_dict(keys)
    assert "\n" not in str(e.value)


def test_bmuf_keys_at_their_defaults_keep_every_run_name():
    assert {"block_momentum", "block_lr", "block_nesterov"} <= set(HASHED_ONLY_OFF_DEFAULT)
    base = from_dict({"local_sgd": 2})
    assert base.replace(block_lr=1.0).experiment_id() == base.experiment_id()
    assert base.replace(block_momentum=0.5).experiment_id() != base.experiment_id()


# -- in the trainer ---------------------------------------------------------------------------------


def _params(model: dict[str, torch.Tensor]) -> torch.Tensor:
    """The parameters of SIX_STEP_ARGS' ResNet-8 (width 8) in the trainer's order, flat
    (float64)."""
    from lbsgd.models import build

    cfg = SimpleNamespace(model="resnet", depth=8, width=8, zero_init_residual=True)
    names = [n for n, _ in build(cfg, 10, 16).named_parameters()]
    return torch.cat([model[n].double().reshape(-1) for n in names])


def _final(out: Path, name: str) -> dict:
    return checkpoint.read(out / "runs" / name / checkpoint.NAME)


@pytest.mark.slow
def test_zero_block_momentum_unit_block_lr_and_n_1_with_plain_sgd_is_synchronous_sgd(tmp_path):
    """2 processes, plain SGD (momentum 0): averaging the parameters after every local step
    through BMUF's filter (forced: this file as the worker) is averaging the gradients (to float
    rounding). What the trainer runs at η_B = 0, ε_B = 1 instead, torch's averager, is held to the
    same by tests/test_comm.py (local_sgd=1 against the all-reduce); that block momentum moves the
    weights off the average, by its formula, is the next test's."""
    keys = [*SIX_STEP_ARGS, "micro_batch=16", "momentum=0", "nesterov=false", f"out_dir={tmp_path}"]
    r = lbsgd(["train", *keys, "name=sync"], nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_fault_worker([*keys, "local_sgd=1", "name=filter"], nproc=2, worker=__file__)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "lbsgd: BMUF" in r.stdout  # the filter ran, at η_B = 0, ε_B = 1
    sync = _params(_final(tmp_path, "sync")["model"])
    got = _params(_final(tmp_path, "filter")["model"])
    assert (got - sync).abs().max() < 1e-5


@pytest.mark.slow
def test_first_block_of_a_two_process_run_is_the_filtered_average(tmp_path):
    """2 processes, warmup of 2 steps, 3 steps: the first block is step 3's local step. Post-local
    SGD's checkpoints give W_g(0) (step 2) and W̄(1) (step 3); BMUF's run must end with
    Δ(1) = ε_B (W̄ − W_g(0)), W(1) = W_g(0) + Δ(1) and the model W_g(1) = W(1) + η_B Δ(1)."""
    eta, eps = 0.5, 1.5
    keys = [
        *SIX_STEP_ARGS,
        "micro_batch=16",
        "epochs=0.375",
        "checkpoint_every=1",
        "local_sgd=2",
        f"out_dir={tmp_path}",
    ]  # fmt: skip  (8 steps per epoch: 2 warmup steps, 3 in all)
    bmuf_keys = [f"block_momentum={eta}", f"block_lr={eps}", "block_nesterov=true"]
    for name, extra in {"local": [], "bmuf": bmuf_keys}.items():
        r = lbsgd(["train", *keys, *extra, f"name={name}"], nproc=2)
        assert r.returncode == 0, r.stderr[-3000:]
    prev = {
        n: checkpoint.read(tmp_path / "runs" / n / checkpoint.PREVIOUS) for n in ("local", "bmuf")
    }
    final = {n: _final(tmp_path, n) for n in ("local", "bmuf")}
    assert prev["local"]["step"] == prev["bmuf"]["step"] == 2
    assert final["local"]["step"] == final["bmuf"]["step"] == 3
    start = _params(prev["local"]["model"])
    assert torch.equal(_params(prev["bmuf"]["model"]), start)  # the same synchronous warmup
    assert prev["bmuf"]["bmuf"]["delta"].abs().max() == 0  # Δ(0) = 0, W(0) = W_g(0)
    assert torch.equal(prev["bmuf"]["bmuf"]["global_model"].double(), start)
    mean = _params(final["local"]["model"])  # W̄(1): post-local SGD's average
    delta = eps * (mean - start)
    state = final["bmuf"]["bmuf"]
    close = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(state["delta"].double(), delta, **close)
    torch.testing.assert_close(state["global_model"].double(), start + delta, **close)
    model = _params(final["bmuf"]["model"])
    torch.testing.assert_close(model, start + delta + eta * delta, **close)
    assert (model - mean).abs().max() > 1e-3  # the filter moved the model off the average


@pytest.mark.slow
def test_bmuf_run_killed_mid_training_resumes_to_bitwise_equal_weights(tmp_path):
    """tests/test_resume.py's 16-step run with local_sgd=2 (local from step 4, blocks end after
    steps 5, 7, 9, …): rank 1 killed before step 11 leaves the checkpoint of step 9 (a block
    end), holding W and Δ once and each process's momentum; the resumed group ends bitwise where
    the uninterrupted one does."""
    saved = killed_and_resumed(
        tmp_path, "b", nproc=2, local_sgd=2, block_momentum=0.5, block_lr=0.9
    )
    assert saved["bmuf"]["delta"].abs().max() > 0
    a, b = (rank["optimizer"]["state"][0]["momentum_buffer"] for rank in saved["ranks"])
    assert not torch.equal(a, b)  # each process's own momentum


def test_one_process_applies_the_filter(tmp_path):
    """K = 1: post-local SGD on one process is plain SGD (nothing to average), BMUF is not."""
    from lbsgd.entry import train

    base = {**TINY, "epochs": 1, "out_dir": str(tmp_path), "local_sgd": 2}
    plain = train(Config(**{**base, "name": "plain"}))
    filtered = train(Config(**{**base, "name": "bmuf", "block_momentum": 0.5}))
    assert plain["status"] == filtered["status"] == "completed"
    a = _final(tmp_path, "plain")["model"]
    b = _final(tmp_path, "bmuf")
    assert b["bmuf"]["delta"].abs().max() > 0
    assert max((a[k].double() - b["model"][k].double()).abs().max().item() for k in a) > 1e-3


def test_switch_step_is_where_the_blocks_start_and_null_is_the_end_of_the_warmup(tmp_path, capsys):
    """K = 1, 8 steps, a warmup of 4: BMUF's blocks from switch_step. Null is the warmup's 4
    (today's start, bitwise); at 8 the blocks never start, and the run is plain local_sgd's
    (plain SGD on one process)."""
    from lbsgd.entry import train

    base = {**TINY, "epochs": 1, "out_dir": str(tmp_path), "local_sgd": 2}
    bmuf = {**base, "block_momentum": 0.5}
    runs = {
        "plain": base,
        "null": bmuf,
        "at_4": {**bmuf, "switch_step": 4},
        "at_8": {**bmuf, "switch_step": 8},
    }
    for name, keys in runs.items():
        assert train(Config(**{**keys, "name": name}))["status"] == "completed"
    out = capsys.readouterr().out
    assert "after step 4," in out and "after step 8," in out
    model = {name: _params(_final(tmp_path, name)["model"]) for name in runs}
    assert torch.equal(model["null"], model["at_4"])
    assert torch.equal(model["at_8"], model["plain"])
    assert (model["null"] - model["plain"]).abs().max() > 1e-3


if __name__ == "__main__":  # a worker: python -m lbsgd, BMUF's filter even at η_B = 0, ε_B = 1
    from lbsgd import cli
    from lbsgd.config import step_features

    step_features.bmuf_filters = lambda c: True
    sys.exit(cli.main(sys.argv[1:]))
