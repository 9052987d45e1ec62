"""Honest throughput: windows tile the training time, warm-up is reported apart, the
step reads nothing from the device, micro_batch=auto is resolved and recorded before the run."""

import json
import time

import pytest
import torch
import yaml

from lbsgd import tracking
from lbsgd.entry import train
from lbsgd.precision import Precision
from lbsgd.trainer import SETTLING_STEPS


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_logged_windows_tile_the_training_time_including_slow_flushes(tiny, monkeypatch):
    # A flush that takes 50 ms of host time (a slow W&B, a slow disk) belongs to some window: the
    # images of all windows over their wall times add up to train_time_s, nothing left out.
    log = tracking.Tracker.log

    def slow_log(self, record, **kw):
        if record.get("kind") == "train":
            time.sleep(0.05)
        return log(self, record, **kw)

    monkeypatch.setattr(tracking.Tracker, "log", slow_log)
    cfg = tiny(epochs=1, log_every=2, eval_every=1)  # 8 steps of 64 images, an eval at the end
    summary = train(cfg)
    steps = [r for r in read_metrics(cfg.run_dir()) if r["kind"] == "train"]
    windows_s = sum(cfg.batch_size / r["img_per_s"] for r in steps)
    assert len(steps) == 8 and windows_s >= 8 * 0.05  # every sleep counted
    assert windows_s == pytest.approx(summary["train_time_s"], rel=1e-6)


def test_summary_separates_the_warm_up_steps_from_steady_throughput(tiny):
    cfg = tiny(epochs=2)  # 16 steps
    summary = train(cfg)
    warm, steps = summary["warmup_steps_timed"], summary["steps"]
    assert warm == SETTLING_STEPS and 0 < summary["warmup_s"] < summary["train_time_s"]
    steady = (steps - warm) * cfg.batch_size / (summary["train_time_s"] - summary["warmup_s"])
    assert summary["img_per_s"] == pytest.approx(steady, rel=1e-9)


def test_fp16_bookkeeping_adds_no_device_read_to_torchs_own(monkeypatch):
    # GradScaler.step reads whether any gradient overflowed (torch's own host read, one per step);
    # the loss scale and the skipped-step count stay on the device until a metric flush reads them
    def reads_per_step(step_fn):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        prec = Precision("fp16", torch.device("cpu"), loss_scale=2.0**10)
        model.weight.register_hook(lambda g: torch.full_like(g, float("inf")))  # always overflows
        reads = []
        real_item = torch.Tensor.item
        for _ in range(3):
            with prec.autocast():
                loss = model(torch.randn(8, 4)).float().pow(2).mean()
            prec.backward(loss)
            monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append(t) or real_item(t))
            step_fn(prec, opt)
            monkeypatch.setattr(torch.Tensor, "item", real_item)
            opt.zero_grad()
        return len(reads), prec

    def bare(prec, opt):
        prec.scaler.step(opt)
        prec.scaler.update()

    def ours(prec, opt):
        prec.step(opt)
        prec.loss_scale_tensor()

    assert reads_per_step(ours)[0] == reads_per_step(bare)[0]
    _, prec = reads_per_step(ours)
    assert float(prec.loss_scale_tensor()) == 2.0**7 and prec.skipped_steps == 3  # at a "flush"


def test_micro_batch_auto_is_resolved_before_the_run_and_recorded_in_config_yaml(tiny):
    # CPU: the largest multiple of bn_batch dividing the per-process share, up to 256 samples
    cfg = tiny(batch_size=64, bn_batch=16, micro_batch="auto", epochs=0.25)
    train(cfg)
    saved = yaml.safe_load((cfg.run_dir() / "config.yaml").read_text())
    assert saved["micro_batch"] == 64 and saved["accum_steps"] == 1
    assert tiny(batch_size=512, micro_batch="auto").micro_batch == "auto"
    big = tiny(batch_size=512, bn_batch=16, micro_batch="auto", epochs=1, synthetic_train=1024)
    train(big)
    saved = yaml.safe_load((big.run_dir() / "config.yaml").read_text())
    assert saved["micro_batch"] == 256 and saved["accum_steps"] == 2
