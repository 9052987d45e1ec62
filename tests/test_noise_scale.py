"""The gradient noise scale (lbsgd.noise_scale; McCandlish et al. 2018, Appendix A).

- The estimators are the paper's formulas (hand-computed values), smoothed as documented.
- On a fixed model (base_lr = 0) the smoothed estimate converges to tr(Σ)/|G|² computed exactly
  from the per-sample gradients of the whole train split: a linear softmax classifier, whose
  per-sample gradient is (p − e_y) ⊗ (x, 1) in closed form.
- The small batch is a unit the layout does not change: one process accumulating and two gloo
  processes (whose last small batch is read by the DDP hook before the all-reduce) log the same
  |G_small|² and |G_big|².
- Measuring changes nothing: the weights are bitwise those of the same run without it.
- A killed run resumes to the same noise-scale records: tests/test_features.py, as every step
  feature of the table.
"""

import json
import math

import pytest
import torch
from conftest import TINY, lbsgd
from helpers import SIX_STEP_ARGS, offline_runs

from lbsgd import checkpoint, data, noise_scale
from lbsgd.config import (
    Config,
    ConfigError,
    accum_steps,
    check_world,
    from_dict,
    parse_overrides,
)
from lbsgd.entry import train


def test_estimators_are_the_papers_formulas_on_hand_computed_values():
    # B_small = 2, B_big = 8, |G_small|^2 = 5, |G_big|^2 = 2:
    # |G|^2 = (8*2 - 2*5) / 6 = 1; tr(Sigma) = (5 - 2) / (1/2 - 1/8) = 8; B_simple = 8
    g_sq, trace = noise_scale.estimate(5.0, 2.0, 2, 8)
    assert (g_sq, trace) == pytest.approx((1.0, 8.0))
    assert noise_scale.ratio(trace, g_sq) == pytest.approx(8.0)
    # and they invert E|G_B|^2 = |G|^2 + tr(Sigma)/B exactly
    g, tr = 0.3, 12.0
    assert noise_scale.estimate(g + tr / 4, g + tr / 32, 4, 32) == pytest.approx((g, tr))
    assert noise_scale.ratio(5.0, -1.0) is None and noise_scale.ratio(5.0, 0.0) is None
    with pytest.raises(ValueError, match="b_small < b_big"):
        noise_scale.estimate(1.0, 1.0, 8, 8)


def test_the_smoother_is_a_bias_corrected_moving_average_of_each_estimate():
    s = noise_scale.Smoother(decay=0.5)
    assert s.value() == (None, None, None)
    s.update(2.0, 10.0)  # after one step the corrected average is the step's value
    assert s.value() == pytest.approx((2.0, 10.0, 5.0))
    s.update(4.0, 30.0)  # (0.5*0.5*2 + 0.5*4) / (1 - 0.25) = 3.333; (2.5 + 15) / 0.75 = 23.33
    g_sq, trace, b = s.value()
    assert (g_sq, trace) == pytest.approx((2.5 / 0.75, 17.5 / 0.75))
    assert b == pytest.approx(17.5 / 2.5)  # the ratio of the averages, not the average of ratios
    again = noise_scale.Smoother(decay=0.5)
    again.load_state_dict(s.state_dict())
    assert again.value() == s.value()


def test_layouts_that_cannot_measure_it_are_refused_with_one_line():
    cfg = Config(**{**TINY, "noise_scale": True})  # batch 64, micro 16: B_small = 16 by default
    check_world(cfg, 1)
    assert accum_steps(cfg, 1) == 4
    with pytest.raises(
        ConfigError, match=r"noise_scale_batch=24 must be a multiple of micro_batch=16"
    ):
        check_world(cfg.replace(noise_scale_batch=24), 1)
    with pytest.raises(ConfigError, match="per-process share .* = 64 / 4 = 16"):
        check_world(cfg.replace(noise_scale_batch=32), 4)
    with pytest.raises(ConfigError, match="must be smaller than batch_size=64"):
        check_world(cfg.replace(micro_batch=64), 1)  # one small batch = the whole batch
    with pytest.raises(ConfigError, match="local_sgd"):
        from_dict({**TINY, "noise_scale": True, "local_sgd": 2})
    with pytest.raises(ConfigError, match="powersgd"):
        from_dict({**TINY, "noise_scale": True, "comm_hook": "powersgd"})
    with pytest.raises(ConfigError, match=r"noise_scale_ema=1.0 must be in \[0, 1\)"):
        from_dict({**TINY, "noise_scale_ema": 1.0})
    # micro_batch=auto picks among micro-batches that make up the small batch whole
    auto = cfg.replace(micro_batch="auto", noise_scale_batch=32)
    check_world(auto, 1)
    assert accum_steps(auto, 1) == 2


LINEAR = """
import torch
from lbsgd import register_model

@register_model("softmax_regression")
def softmax_regression(cfg, num_classes, image_size):
    return torch.nn.Sequential(torch.nn.Flatten(),
                               torch.nn.Linear(3 * image_size**2, num_classes))
"""


def test_at_a_fixed_point_the_estimate_converges_to_the_exact_noise_scale(tmp_path):
    """A linear softmax classifier trained at lr 0 (so the model stays where it started): the
    smoothed B_simple of 30 epochs of steps equals tr(Σ)/|G|² of the per-sample gradients of the
    whole train split, up to the sampling noise of 30 passes, once the finite-population term of
    sampling without replacement is accounted for (lbsgd.noise_scale.exact)."""
    plugin = tmp_path / "linear_model.py"
    plugin.write_text(LINEAR)
    cfg = from_dict(
        {
            **TINY,
            "model": "softmax_regression",
            "plugins": (str(plugin),),
            "synthetic_train": 2048,
            "base_lr": 0.0,
            "weight_decay": 0.0,
            "epochs": 30,
            "batch_size": 128,
            "micro_batch": 16,
            "reference_batch": 128,
            "noise_scale": True,
            "noise_scale_batch": 32,
            "noise_scale_ema": 0.998,
            "log_every": 50,
            "out_dir": str(tmp_path / "results"),
            "checkpoint": False,
            "eval_every": 0,
        }
    )
    summary = train(cfg)
    assert summary["status"] == "completed" and summary["noise_scale"]["b_small"] == 32

    # the exact value, from the same (unchanged) weights and every training sample
    torch.manual_seed(cfg.seed)  # the trainer's initialisation, rebuilt
    from lbsgd import models

    splits = data.build(cfg, torch.device("cpu"))
    net = models.build(cfg, splits.num_classes, splits.image_size)
    x, y = next(data.batches(splits.train, [torch.arange(len(splits.train))]))
    x = x.flatten(1).double()
    w, b = (p.detach().double() for p in net[1].parameters())
    p = torch.softmax(x @ w.T + b, dim=1)
    err = p - torch.nn.functional.one_hot(y, splits.num_classes).double()  # dL/dlogits
    per_sample = torch.cat([(err[:, :, None] * x[:, None, :]).flatten(1), err], dim=1)
    g_sq, trace, b_simple = noise_scale.exact(per_sample)
    # the same gradient by autograd: the closed form is the classifier's
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(x.float().view(-1, 3, 16, 16)), y).backward()
    autograd = torch.cat([net[1].weight.grad.flatten(), net[1].bias.grad]).double()
    torch.testing.assert_close(autograd, per_sample.mean(0), rtol=1e-4, atol=1e-6)

    # Without replacement the |G|^2 estimator's mean is |G|^2 - tr(Sigma)/N (lbsgd.noise_scale):
    # the smoothed ratio converges to tr(Sigma) / (|G|^2 - tr(Sigma)/N), 1/(1 - B_simple/N) times
    # the definition (here B_simple = 243 of N = 2048: 13 % above it)
    n = len(per_sample)
    expected = trace / (g_sq - trace / n)
    assert expected == pytest.approx(b_simple / (1 - b_simple / n))
    measured = summary["noise_scale"]["b_simple"]
    print(
        f"B_simple: exact {b_simple:.1f}, expected without replacement {expected:.1f}, "
        f"measured {measured:.1f}"
    )
    assert measured == pytest.approx(expected, rel=0.03)
    assert summary["noise_scale"]["trace"] == pytest.approx(trace, rel=0.05)
    assert summary["noise_scale"]["g_sq"] == pytest.approx(g_sq - trace / n, rel=0.08)


def _train_records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.mark.slow
def test_one_process_and_two_processes_measure_the_same_noise_scale(tmp_path):
    """Micro-batches of 8, batch 32. B_small = 16: one process accumulating 4 micro-batches (two
    small batches, read between micro-batches) and two processes accumulating 2 each (each one's
    small batch read by the DDP hook before the all-reduce). B_small = 8: the two processes read
    one small batch between micro-batches and the other in the hook, as a change since the first.
    Each pair logs the same norms every step. Two processes without the measurement end with
    bitwise the weights of two processes measuring."""
    keys = [k for k in SIX_STEP_ARGS if not k.startswith("bn_batch")] + [
        "bn_batch=8",
        "micro_batch=8",
    ]
    runs = {"two_off": (2, [])}
    for b_small in (16, 8):
        noise = ["noise_scale=true", f"noise_scale_batch={b_small}"]
        runs |= {f"one{b_small}": (None, noise), f"two{b_small}": (2, noise)}
    for name, (nproc, extra) in runs.items():
        args = [*keys, *extra, f"out_dir={tmp_path}", f"name={name}"]
        if nproc is None:  # one process: the trainer in this one, no interpreter to start
            assert train(from_dict(parse_overrides(args)))["status"] == "completed"
            continue
        r = lbsgd(["train", *args], nproc)
        assert r.returncode == 0, r.stderr[-3000:]
    for b_small in (16, 8):
        one, two = (_train_records(tmp_path / "runs" / f"{n}{b_small}") for n in ("one", "two"))
        assert len(one) == len(two) == 6
        for a, b in zip(one, two, strict=True):
            assert (a["gns_b_small"], a["gns_b_big"]) == (b["gns_b_small"], b["gns_b_big"])
            assert (a["gns_b_small"], a["gns_b_big"]) == (b_small, 32)
            for key in ("gns_g_small_sq", "gns_g_big_sq", "gns_g_sq", "gns_trace"):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (a["step"], key)
            assert a["gns_g_small_sq"] > a["gns_g_big_sq"] > 0  # the small batch is the noisier
    on = checkpoint.load(tmp_path / "runs" / "two8")["model"]
    off = checkpoint.load(tmp_path / "runs" / "two_off")["model"]
    assert all(torch.equal(on[k], off[k]) for k in off)


def test_measuring_changes_no_digit_of_training(tiny, tmp_path):
    """Single process, two small batches of two micro-batches each per step: the weights equal the
    unmeasured run's bitwise."""
    base = {"micro_batch": 16, "log_every": 4}
    off = train(tiny(study="off", **base))
    on = train(tiny(study="on", noise_scale=True, noise_scale_batch=32, **base))
    assert off["final"] == on["final"]
    w_off = checkpoint.load(tmp_path / "results" / "off" / off["run"])["model"]
    w_on = checkpoint.load(tmp_path / "results" / "on" / on["run"])["model"]
    assert all(torch.equal(w_on[k], w_off[k]) for k in w_off)
    assert (on["noise_scale"]["b_small"], on["noise_scale"]["b_big"]) == (32, 64)
    full = _train_records(tmp_path / "results" / "on" / on["run"])
    assert len(full) == on["steps"] and all(math.isfinite(r["gns_trace"]) for r in full)


def test_fp16_measures_the_unscaled_gradients(tiny):
    """fp16 scales the loss by 2^16 before the backward: the norms are divided by the scale
    squared, so the first step (same weights, same batch) measures what fp32 measures, to the
    rounding of half precision."""
    keys = {"noise_scale": True, "epochs": 0.25, "log_every": 1, "checkpoint": False}
    runs = {p: tiny(study=p, precision=p, **keys) for p in ("fp32", "fp16")}
    first = {}
    for p, cfg in runs.items():
        train(cfg)
        first[p] = _train_records(cfg.run_dir())[0]
    assert first["fp16"]["loss_scale"] == 2.0**16
    for key in ("gns_g_small_sq", "gns_g_big_sq"):
        assert first["fp16"][key] == pytest.approx(first["fp32"][key], rel=2e-2)


def test_wandb_gets_the_noise_scale_with_both_batch_sizes_named(tiny, tmp_path, monkeypatch):
    """Read back from W&B's own offline files: every point carries the smoothed B_simple and
    B_small/B_big of the run, equal to metrics.jsonl's record of the same step."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = tiny(wandb="offline", noise_scale=True, noise_scale_batch=32, epochs=1)
    assert train(cfg)["status"] == "completed"
    (run,) = offline_runs(cfg.run_dir())
    records = {r["step"]: r for r in _train_records(cfg.run_dir())}
    points = dict(run.points("train/gns_b_simple_ema"))
    flushed = [s for s in records if s in dict(run.points("train/loss"))]
    # a point per flush, but none where the smoothed |G|^2 was not yet positive (None)
    assert [s for s in flushed if records[s]["gns_b_simple_ema"] is not None] == list(points)
    assert len(points) >= 2
    for step, value in points.items():
        assert value == pytest.approx(records[step]["gns_b_simple_ema"], rel=1e-12)
    assert {v for _, v in run.points("train/gns_b_small")} == {32}
    assert {v for _, v in run.points("train/gns_b_big")} == {64}
