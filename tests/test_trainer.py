"""The trainer end to end on CPU: outputs, run-directory safety, resume, the extension point (that it
learns: tests/test_precision.py, whose precisions track its fp32 run)."""

import json
import math
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import TINY, as_args, subprocess_env, tiny_subset
from helpers import write_cifar

from lbsgd import checkpoint, rundir
from lbsgd.config import ConfigError, derive
from lbsgd.entry import train
from lbsgd.features import Pending, pack_flush, unpack_flush
from lbsgd.models import MODELS, register_model
from lbsgd.schedules import learning_rate
from lbsgd.trainer import Run


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_writes_config_metrics_and_summary_as_promised(tiny):
    cfg = tiny()
    summary = train(cfg)
    run_dir = cfg.run_dir()
    d = derive(cfg, 1, cfg.synthetic_train)
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == {**cfg.to_dict(), **d.to_dict()}
    records = read_metrics(run_dir)
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, d.total_steps + 1))  # one per optimizer step
    for r in steps:  # the logged lr is the schedule's lr of that update
        assert r["lr"] == pytest.approx(learning_rate(r["step"] - 1, cfg, d))
        assert math.isfinite(r["loss"]) and r["img_per_s"] > 0
        assert r["epoch"] == pytest.approx(r["step"] * cfg.batch_size / cfg.synthetic_train)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["epoch"] for r in evals] == [1.0, 2.0]  # eval_every=1 epoch
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    rundir.check_summary(on_disk)  # summary.json's declared shape, read back
    assert on_disk["status"] == "completed" and on_disk["steps"] == d.total_steps
    assert on_disk["final"]["top1_error_pct"] == evals[-1]["top1_error_pct"]
    env = on_disk["environment"]
    assert env["torch"] == torch.__version__ and "git_commit" in env and env["world_size"] == 1
    assert on_disk["img_per_s"] > 0 and on_disk["wall_time_s"] >= on_disk["train_time_s"]


def test_a_summary_of_another_shape_is_refused_and_the_file_before_it_kept(tmp_path):
    start = {
        "status": rundir.Status.RUNNING,
        "run": "r",
        "study": None,
        "experiment_id": "0123abcd",
        "steps": 0,
        "total_steps": 8,
        "environment": {},
    }
    rundir.write_summary(tmp_path, start)
    before = (tmp_path / "summary.json").read_text()
    for bad, field in (
        ({"grad_norms": [1.0]}, "grad_norms: Extra inputs are not permitted"),
        ({"steps": 2.5}, "steps: Input should be a valid integer"),
        ({"final": {"top1_error": 3.0}}, "final.top1_error: Extra inputs are not permitted"),
    ):
        with pytest.raises(ValueError, match=f"^summary.json of another shape: {field}"):
            rundir.write_summary(tmp_path, {**start, **bad})
    assert (tmp_path / "summary.json").read_text() == before
    assert json.loads(before)["status"] == "running"


def test_existing_run_directory_is_never_overwritten(tiny):
    cfg = tiny(epochs=0.5, name="fixed")  # a fixed name: otherwise the name tracks the keys
    train(cfg)
    run_dir = cfg.run_dir()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(
        ConfigError, match="already holds a run \\(status=completed\\).*resume=true"
    ):
        train(cfg)
    with pytest.raises(ConfigError, match="experiment keys differ.*batch_size"):
        train(cfg.replace(resume=True, batch_size=128))
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_resume_continues_from_the_last_checkpoint_to_the_same_weights(tiny, monkeypatch):
    reference = tiny(name="straight", epochs=3)
    train(reference)

    # the same run, stopped by a crash at the end of epoch 2 (after epoch 1's checkpoint) ...
    cfg = tiny(name="crashed", epochs=3)
    real_evaluate = Run.evaluate

    def crash_at_epoch_2(self, step):
        if step * cfg.batch_size // cfg.synthetic_train == 2:
            raise RuntimeError("simulated crash")
        return real_evaluate(self, step)

    monkeypatch.setattr(Run, "evaluate", crash_at_epoch_2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg)
    failed = json.loads((cfg.run_dir() / "summary.json").read_text())
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert failed["total_wall_time_s"] == failed["wall_time_s"] > 0
    assert checkpoint.load(cfg.run_dir())["step"] == 8  # 512 / 64 = 8 steps per epoch
    monkeypatch.setattr(Run, "evaluate", real_evaluate)

    # ... and resumed: it finishes with bitwise the weights of the uninterrupted run
    summary = train(cfg.replace(resume=True))
    assert summary["status"] == "completed"
    # its wall time: this attempt's, and the total over both (the failed one's as it ended)
    assert summary["attempts"] == 2
    assert summary["total_wall_time_s"] == pytest.approx(
        failed["wall_time_s"] + summary["wall_time_s"]
    )
    want = checkpoint.load(reference.run_dir())["model"]
    got = checkpoint.load(cfg.run_dir())["model"]
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    steps = [r["step"] for r in read_metrics(cfg.run_dir()) if r["kind"] == "train"]
    assert steps == list(range(1, 25))  # records after the checkpoint were replaced, not repeated


def test_user_registered_model_trains_with_every_recipe_without_editing_lbsgd(tiny):
    name = "test_mlp"
    if name not in MODELS:

        @register_model(name)
        def mlp(cfg, num_classes, image_size):
            return torch.nn.Sequential(
                torch.nn.Flatten(),
                torch.nn.Linear(3 * image_size**2, 64),
                torch.nn.ReLU(),
                torch.nn.Linear(64, num_classes),
            )

    # no BN: any micro-batch works; constant warmup and step decay from the vocabulary
    cfg = tiny(
        model=name,
        micro_batch=32,
        warmup="constant",
        warmup_lr=0.01,
        base_lr=0.1,
        schedule="step",
        milestones=[3],
        epochs=4,
    )
    summary = train(cfg)
    assert summary["status"] == "completed"
    assert summary["run"].startswith(f"{name}-synthetic-b64-constant")
    train_recs = [r for r in read_metrics(cfg.run_dir()) if r["kind"] == "train"]
    lrs = [r["lr"] for r in train_recs]
    assert lrs == [0.01] * 4 + [0.1] * 20 + [pytest.approx(0.01)] * 8  # 8 steps per epoch
    losses = [r["loss"] for r in train_recs]
    assert sum(losses[-8:]) / 8 < 0.9 * sum(losses[:8]) / 8  # it trained


def test_file_dataset_trains_through_dataloader_workers(tiny, tmp_path):
    # CIFAR-10 in torchvision's format (files written by the test), loaded by a worker process
    write_cifar(tmp_path / "cifar", per_batch=8, n_test=10)  # 40 train, 10 test images
    cfg = tiny(
        dataset="cifar10",
        data_dir=str(tmp_path / "cifar"),
        depth=8,
        width=4,
        batch_size=20,
        bn_batch=10,
        reference_batch=20,
        epochs=2,
        workers=1,
    )
    summary = train(cfg)
    assert summary["status"] == "completed" and summary["steps"] == 4  # 40 / 20 x 2 epochs
    evals = [r for r in read_metrics(cfg.run_dir()) if r["kind"] == "eval"]
    assert len(evals) == 2
    # 10 test images: every error is a multiple of 10%
    assert all(round(r["top1_error_pct"], 6) % 10 == 0 for r in evals)


@pytest.mark.parametrize("model", ["alexnet_bn", "resnet"])
def test_lars_run_with_poly_decay_trains_and_reports_its_parameter_groups(tiny, model, capsys):
    # You et al.: LARS with poly(2) decay; Jia: no decay/adaptation on bias and BN
    cfg = tiny(
        model=model,
        optimizer="lars",
        schedule="poly",
        base_lr=2.0,
        nesterov=False,
        weight_decay=5e-4,
        pool5_bn=model == "alexnet_bn",
        epochs=4,
        name=f"lars_{model}",
    )
    summary = train(cfg)
    assert summary["status"] == "completed"
    out = capsys.readouterr().out
    assert "parameter groups: decay+adapt" in out and "no decay/adapt (bias, norm)" in out
    losses = [r["loss"] for r in read_metrics(cfg.run_dir()) if r["kind"] == "train"]
    assert sum(losses[-8:]) / 8 < 0.98 * sum(losses[:8]) / 8  # it trained (32 steps: ~3-4% lower)


def test_bench_commands_compare_against_a_baseline_in_the_same_process(tmp_path, monkeypatch):
    from lbsgd.bench import train as bench

    monkeypatch.setattr(bench, "RECIPES", {"precision": bench.RECIPES["precision"][:2]})
    tiny_keys = as_args(
        tiny_subset(
            ["synthetic_train", "synthetic_test", "synthetic_difficulty", "depth"],
            synthetic_test=128,
            width=4,
            device="cpu",
        )
    )
    t = bench.bench_train(tiny_keys, steps=3, repeats=2, out=str(tmp_path / "t.json"))
    assert t["ratio"] == pytest.approx(t["trainer_img_per_s"] / t["bare_img_per_s"])
    assert len(t["all_bare"]) == len(t["all_trainer"]) == 2
    r = bench.bench_recipes(tiny_keys, samples=64, repeats=1, out=str(tmp_path / "r.json"))
    rows = r["results"]["precision"]
    assert [row["variant"] for row in rows] == ["fp32", "bf16"]
    assert rows[0]["ratio_best"] == 1.0
    assert rows[1]["ratio_best"] == pytest.approx(
        rows[1]["best_img_per_s"] / rows[0]["best_img_per_s"]
    )
    assert json.loads((tmp_path / "r.json").read_text())["results"] == json.loads(
        json.dumps(r["results"])
    )


def test_deterministic_mode_holds_during_the_run_and_is_undone_after_it(tiny, monkeypatch):
    seen = []
    run = Run.run

    def spy(self):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return run(self)

    monkeypatch.setattr(Run, "run", spy)
    assert not torch.are_deterministic_algorithms_enabled()
    summary = train(tiny(deterministic=True, epochs=0.25))
    assert seen == [True] and summary["environment"]["deterministic"] is True
    assert summary["environment"]["backend"] == "gloo"  # what a group on this device would use
    assert not torch.are_deterministic_algorithms_enabled()  # a notebook's process as it was


# -- the flush's packing (lbsgd.features): what goes into its one all-reduce comes back named ------


@pytest.mark.parametrize("extra_per_step", [0, 2], ids=["plain", "noise_scale"])
def test_the_flush_packing_round_trips(extra_per_step):
    pending = [
        Pending(
            step + 1,
            0.1 * step,
            torch.tensor(1.5 + step),
            torch.tensor(2.0**step) if step else 1.0,
            [torch.tensor([10.0 * step + j for j in range(extra_per_step)], dtype=torch.float64)]
            if extra_per_step
            else [],
        )
        for step in range(3)
    ]
    packed = pack_flush(pending, torch.tensor(1.0))
    assert packed.dtype == (torch.float64 if extra_per_step else torch.float32)
    got = unpack_flush(packed.tolist(), len(pending))
    assert got.losses == [1.5, 2.5, 3.5]
    assert got.scales == [1.0, 2.0, 4.0]
    assert got.stop_asked is True
    assert got.extra == [10.0 * s + j for s in range(3) for j in range(extra_per_step)]
    assert unpack_flush(pack_flush(pending, torch.tensor(0.0)).tolist(), 3).stop_asked is False


@pytest.mark.slow
def test_a_one_process_run_never_imports_torch_dynamo(tmp_path):
    # torch._dynamo costs ~2.3 s of CPU to import, which every run would pay at its start: the
    # model is sized on the meta device without running its initialisers, the optimizer's methods
    # are called without torch.compile's markers, and determinism is set only when it changes
    keys = {**TINY, "out_dir": str(tmp_path), "epochs": 1, "checkpoint": True}
    code = (
        "import sys; from lbsgd.config import Config; from lbsgd.entry import train; "
        f"s = train(Config(**{keys!r})); "
        "print(s['status'], 'torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env()
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["completed", "False", "False"], out.stdout[-3000:]
