"""Mixed precision (Jia et al. 2018): fp16 with fp32 master weights and dynamic loss scaling, bf16."""

import json
import math

import pytest
import torch
from conftest import LEARNING, TINY

from lbsgd.config import Config
from lbsgd.entry import train
from lbsgd.precision import Precision


def read_train(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.fixture(scope="module")
def learning_runs(tmp_path_factory) -> dict:
    """The tiny config's learning run (conftest.LEARNING) in fp32, bf16 and fp16: each one's
    summary and per-step training losses. Trained once for the tests below."""
    out = tmp_path_factory.mktemp("learning")
    runs = {}
    for precision in ("fp32", "bf16", "fp16"):
        cfg = Config(**{**TINY, **LEARNING, "out_dir": str(out), "precision": precision})
        summary = train(cfg)
        runs[precision] = (summary, [r["loss"] for r in read_train(cfg.run_dir())])
    return runs


@pytest.mark.slow
def test_short_run_on_synthetic_learns_well_below_chance(learning_runs):
    # 4,000 easy images, 3 epochs at batch 32: chance is 90% top-1 error; measured ~50% in fp32.
    # (gamma=1: at this scale gamma=0 lengthens the initial plateau beyond 3 epochs.)
    summary, _ = learning_runs["fp32"]
    assert summary["status"] == "completed"
    assert summary["final"]["top1_error_pct"] < 70.0, summary["final"]


@pytest.mark.slow
def test_fp16_and_bf16_runs_track_the_fp32_loss(learning_runs):
    # ResNet-8 on 4,000 easy images, 375 steps. Measured on this setting: the per-window losses of
    # fp32 with seeds 0 and 1 differ by up to 5%; bf16/fp16 leave the initial plateau (loss ~2.3)
    # earlier and sit up to ~16% below fp32 mid-run (rounding noise helps the escape), then close
    # in. So: the same curve within 20% in every window, and the same final accuracy within 15
    # points. The numerics themselves are held much tighter below (same weights, same batch).
    curves, errors = {}, {}
    for precision, (summary, losses) in learning_runs.items():
        assert summary["status"] == "completed"
        curves[precision] = losses
        errors[precision] = summary["final"]["top1_error_pct"]

    def windows(curve, w=75):  # mean loss over windows of 75 steps (375 steps in all)
        return [sum(curve[i : i + w]) / w for i in range(0, len(curve), w)]

    ref = windows(curves["fp32"])
    assert ref[-1] < 0.7 * ref[0]  # the reference run learned, so tracking it means something
    for precision in ("bf16", "fp16"):
        ours = windows(curves[precision])
        gaps = [abs(a - b) / b for a, b in zip(ours, ref, strict=True)]
        assert max(gaps) < 0.2, (precision, ours, ref)
        assert abs(errors[precision] - errors["fp32"]) < 15, errors
        assert curves[precision] != curves["fp32"]  # and it really ran in lower precision


@pytest.mark.parametrize(
    ("precision", "loss_tol", "grad_cos"), [("bf16", 0.01, 0.99), ("fp16", 0.002, 0.999)]
)
def test_half_precision_forward_and_gradients_match_fp32_on_the_same_weights(
    precision, loss_tol, grad_cos
):
    from types import SimpleNamespace

    from lbsgd.models import build, ghost_bn

    torch.manual_seed(0)
    cfg = SimpleNamespace(model="resnet", depth=8, width=8, zero_init_residual=False)
    model = ghost_bn.convert(build(cfg, 10, 16), 16)
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))

    def loss_and_grad(prec):
        model.zero_grad()
        with prec.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        prec.backward(loss)
        prec.scaler.unscale_(
            torch.optim.SGD(model.parameters(), lr=0.0)
        ) if prec.scaler.is_enabled() else None
        return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])

    ref_loss, ref_grad = loss_and_grad(Precision("fp32", torch.device("cpu")))
    loss, grad = loss_and_grad(Precision(precision, torch.device("cpu"), loss_scale=2.0**10))
    assert abs(loss - ref_loss) / ref_loss < loss_tol
    assert torch.nn.functional.cosine_similarity(grad, ref_grad, dim=0) > grad_cos


def test_weights_stay_fp32_master_copies_under_fp16_autocast():
    model = torch.nn.Linear(4, 3)
    prec = Precision("fp16", torch.device("cpu"))
    with prec.autocast():
        out = model(torch.randn(2, 4))
    assert out.dtype == torch.float16 and model.weight.dtype == torch.float32
    prec.backward(out.float().sum())
    assert model.weight.grad.dtype == torch.float32


def _overflow_once(param):
    fired = []

    def hook(grad):
        if not fired:
            fired.append(True)
            return torch.full_like(grad, math.inf)
        return grad

    param.register_hook(hook)


def test_forced_overflow_skips_the_step_and_lowers_the_scale():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec = Precision("fp16", torch.device("cpu"), loss_scale=1024.0)
    _overflow_once(model.weight)
    x = torch.randn(8, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    with prec.autocast():
        loss = model(x).float().pow(2).mean()
    prec.backward(loss)
    prec.step(opt)  # inf in the gradients: skipped ...
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # ... untouched
    assert prec.loss_scale == 512.0 and prec.skipped_steps == 1  # ... and the scale halved
    opt.zero_grad()

    with prec.autocast():
        loss = model(x).float().pow(2).mean()
    prec.backward(loss)
    prec.step(opt)  # a clean step updates the weights with unscaled gradients
    assert prec.loss_scale == 512.0 and prec.skipped_steps == 1
    assert not torch.equal(model.weight, before["weight"])


def test_optimizer_sees_unscaled_gradients_under_fp16():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    x = torch.randn(8, 4)
    ref = model.weight.detach().clone().requires_grad_(True)
    (x @ ref.T).pow(2).mean().backward()  # the true fp32 gradient
    seen = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(model.weight.grad.clone())
            return super().step(closure)

    prec = Precision("fp16", torch.device("cpu"), loss_scale=2.0**10)
    with prec.autocast():
        loss = model(x).float().pow(2).mean()
    prec.backward(loss)
    prec.step(Spy(model.parameters(), lr=0.1))
    torch.testing.assert_close(seen[0], ref.grad, rtol=2e-3, atol=1e-4)  # fp16 forward rounding


@pytest.mark.slow
def test_fp16_run_logs_loss_scale_and_skipped_steps(tiny):
    # 2^30 overflows fp16 activation gradients (max 65504): steps are skipped, the scale halves
    cfg = tiny(precision="fp16", loss_scale=2.0**30, epochs=3, zero_init_residual=False)
    summary = train(cfg)
    assert summary["status"] == "completed"
    recs = read_train(cfg.run_dir())
    scales = [r["loss_scale"] for r in recs]
    assert scales[0] < 2.0**30 and scales == sorted(scales, reverse=True)
    assert summary["skipped_steps"] == round(math.log2(2.0**30 / scales[-1]))
    assert summary["skipped_steps"] >= 1


def test_divergence_ends_the_run_with_status_diverged(tiny):
    cfg = tiny(base_lr=1e8, warmup="none")
    summary = train(cfg)
    assert summary["status"] == "diverged"
    on_disk = json.loads((cfg.run_dir() / "summary.json").read_text())
    assert on_disk["status"] == "diverged" and on_disk["steps"] < 16
    losses = [r["loss"] for r in read_train(cfg.run_dir())]
    assert any(isinstance(v, str) or not math.isfinite(v) for v in losses)
