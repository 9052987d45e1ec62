"""holdout (lbsgd.data.hold_out): a validation split carved from the train split, the same images
for every trial of a sweep (any seed, batch size or layout); the run trains on the rest and
evaluates the held-out images beside the test split, under the test metrics' names with "val_"."""

import json
import math
import shutil

import pytest
import torch
import yaml
from conftest import TINY

from lbsgd import checkpoint, data, models, seeding, train
from lbsgd.config import Config
from lbsgd.data import DeviceImages
from lbsgd.lab import experiments
from lbsgd.models import ghost_bn

HOLDOUT = 128  # of TINY's 512 synthetic training images


def _by_hand(num_train: int, holdout: int) -> torch.Tensor:
    """The held-out indices as the key's help states them: the first ``holdout`` of the fixed
    permutation, sorted."""
    g = torch.Generator().manual_seed(seeding.HOLDOUT_SEED)
    return torch.randperm(num_train, generator=g)[:holdout].sort().values


def _build(**keys) -> data.Splits:
    return data.build(Config(**{**TINY, **keys}), torch.device("cpu"))


def test_the_split_is_disjoint_covers_the_train_split_and_ignores_seed_batch_and_layout():
    whole = _build()
    x, y = whole.train.tensors
    val_idx, train_idx = data.holdout_indices(len(x), HOLDOUT)
    assert torch.equal(val_idx, _by_hand(len(x), HOLDOUT))
    assert torch.equal(train_idx, train_idx.sort().values)  # the rest in their original order
    assert set(val_idx.tolist()).isdisjoint(train_idx.tolist())
    assert sorted(val_idx.tolist() + train_idx.tolist()) == list(range(len(x)))
    for keys in ({}, {"seed": 3}, {"batch_size": 128, "micro_batch": 32}, {"bn_batch": 8}):
        s = _build(holdout=HOLDOUT, **keys)
        assert (len(s.train), len(s.val)) == (len(x) - HOLDOUT, HOLDOUT)
        assert torch.equal(s.val.tensors[0], x[val_idx]) and torch.equal(
            s.val.tensors[1], y[val_idx]
        )
        assert torch.equal(s.train.tensors[0], x[train_idx])
        assert torch.equal(s.test.tensors[0], whole.test.tensors[0])  # the test split untouched
    # a larger holdout holds out the smaller one's images and more
    assert set(data.holdout_indices(len(x), 64)[0].tolist()) < set(val_idx.tolist())


@pytest.mark.parametrize("holdout", [0, HOLDOUT])
def test_train_size_from_the_keys_is_the_built_train_split(holdout):
    cfg = Config(**{**TINY, "holdout": holdout})
    assert data.train_size(cfg) == len(data.build(cfg, torch.device("cpu")).train)
    fake = Config(dataset="fake", fake_train=96, fake_test=32, holdout=holdout // 8)
    assert data.train_size(fake) == len(data.build(fake, torch.device("cpu")).train)


def test_holdout_0_leaves_the_train_split_and_every_run_name_as_they_were():
    assert Config(holdout=0).experiment_id() == "7e6ebad0"  # the default's id before the key
    assert Config(**TINY, holdout=0).run_name() == Config(**TINY).run_name()
    assert Config(**TINY, holdout=1).run_name() != Config(**TINY).run_name()
    whole = _build()
    assert whole.val is None and len(whole.train) == TINY["synthetic_train"]


def test_device_images_keep_their_augmentation_in_train_and_are_not_augmented_held_out():
    """CIFAR-10's and Fashion-MNIST's splits: the train part keeps pad-crop-flip, sample for
    sample (the same seed, the same crop); the held-out part is normalised only, as the test
    split is."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 1, 8, 8), dtype=torch.uint8, generator=g)
    labels = torch.arange(40) % 10
    whole = DeviceImages(images, labels, (0.5,), (0.25,), augment=True, channels=3, pad=2)
    test = DeviceImages(images[:5], labels[:5], (0.5,), (0.25,), augment=False, channels=3)
    s = data.hold_out(data.Splits(whole, test, 10, 8), 10)
    val_idx, train_idx = data.holdout_indices(40, 10)
    assert isinstance(s.val, DeviceImages) and isinstance(s.train, DeviceImages)
    assert s.train.augment and not s.val.augment and whole.augment
    assert (s.val.pad, s.val.channels, s.val.mean) == (2, 3, (0.5,))
    seeds = seeding.augmentation(0, torch.arange(10))
    x_val, y_val = s.val.batch(torch.arange(10), seeds)
    plain = DeviceImages(images[val_idx], labels[val_idx], (0.5,), (0.25,), augment=False)
    assert torch.equal(x_val, plain.batch(torch.arange(10))[0].expand(-1, 3, -1, -1))
    assert torch.equal(y_val, labels[val_idx])
    x_tr, _ = s.train.batch(torch.arange(10), seeds)
    assert torch.equal(x_tr, whole.batch(train_idx[:10], seeds)[0])  # augmented as before
    assert not torch.equal(x_tr, whole.for_evaluation().batch(train_idx[:10])[0])


@pytest.fixture(scope="module")
def holdout_run(tmp_path_factory):
    """TINY for one epoch with 128 of its 512 images held out: 384 to train on, 6 steps."""
    out = tmp_path_factory.mktemp("holdout")
    cfg = Config(**{**TINY, "epochs": 1, "holdout": HOLDOUT, "out_dir": str(out), "name": "h"})
    train(cfg)
    return cfg, out / "runs" / "h"


def _records(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_a_run_trains_on_the_rest_and_its_val_metrics_are_the_final_model_on_the_held_out_images(
    holdout_run,
):
    cfg, run_dir = holdout_run
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["num_train"] == 512 - HOLDOUT and written["total_steps"] == 6
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["environment"]["dataset_digest"]["samples"] == 512 - HOLDOUT
    # the final weights, evaluated by hand on the held-out images (every one at once)
    net = ghost_bn.convert(models.build(cfg, 10, 16), cfg.bn_batch)
    net.load_state_dict(checkpoint.read(run_dir / checkpoint.NAME)["model"])
    net.eval()
    x, y = _build().train.tensors
    idx = _by_hand(len(x), HOLDOUT)
    with torch.no_grad():
        out = net(x[idx])
    hits = (out.argmax(1) == y[idx]).sum().item()
    final = summary["final"]
    assert final["val_top1_error_pct"] == 100.0 * (1 - hits / HOLDOUT)
    loss = torch.nn.functional.cross_entropy(out, y[idx]).item()
    assert final["val_loss"] == pytest.approx(loss, rel=1e-5)
    assert not math.isclose(final["val_loss"], final["test_loss"], rel_tol=1e-5)
    evals = _records(run_dir, "eval")
    assert len(evals) == 1 and {k: evals[-1][k] for k in final if k != "train_loss"} == {
        k: v for k, v in final.items() if k != "train_loss"
    }
    assert summary["best"]["val_top1_error_pct"] == final["val_top1_error_pct"]
    assert summary["best"]["val_step"] == 6


def test_the_runs_dataframe_has_the_val_columns_and_nan_for_a_run_without_holdout(holdout_run):
    _, run_dir = holdout_run
    old = run_dir.parent / "old"  # a run as one made before the key reads: no val metrics
    shutil.copytree(run_dir, old)
    keys = yaml.safe_load((old / "config.yaml").read_text())
    del keys["holdout"]
    keys["name"] = "old"
    (old / "config.yaml").write_text(yaml.safe_dump(keys))
    summary = json.loads((old / "summary.json").read_text())
    summary["final"] = {k: v for k, v in summary["final"].items() if not k.startswith("val_")}
    summary["best"] = {k: v for k, v in summary["best"].items() if not k.startswith("val_")}
    (old / "summary.json").write_text(json.dumps(summary))
    df = experiments.load_runs(run_dir.parent).set_index("name")
    columns = ["final_val_top1_error_pct", "final_val_top5_error_pct", "final_val_loss"]
    columns += ["best_val_top1_error_pct", "best_val_step"]
    assert df.loc["h", columns].notna().all() and df.loc["old", columns].isna().all()
    assert df.loc["h", "holdout"] == HOLDOUT and df.loc["old", "holdout"] == 0


def test_a_sweep_line_shows_the_held_out_error_of_a_run_that_has_one(tmp_path):
    """A tuning trial is chosen by its held-out error; its test error stays out of the sweep's
    lines (study 14 reports the test error of the chosen settings only)."""
    final = {"top1_error_pct": 12.345, "val_top1_error_pct": 20.0}
    (tmp_path / "summary.json").write_text(json.dumps({"final": final, "img_per_s": 1000.4}))
    assert experiments.result_text(tmp_path) == ", held-out top-1 error 20.0%, 1000 img/s"
    del final["val_top1_error_pct"]
    (tmp_path / "summary.json").write_text(json.dumps({"final": final, "img_per_s": 1000.4}))
    assert experiments.result_text(tmp_path) == ", top-1 error 12.3%, 1000 img/s"


def test_eval_per_octave_probes_the_held_out_split_at_log_steps_and_changes_no_training_digit(
    holdout_run, tmp_path
):
    cfg, run_dir = holdout_run
    probed = Config(**{**cfg.to_dict(), "eval_per_octave": 1, "out_dir": str(tmp_path)})
    train(probed)
    got = tmp_path / "runs" / "h"
    evals = _records(got, "eval")
    # steps 1, 2, 4 of 6 (2^j): the held-out split alone; step 6, the end: both splits
    assert [r["step"] for r in evals] == [1, 2, 4, 6]
    assert all("val_top1_error_pct" in r and "top1_error_pct" not in r for r in evals[:3])
    assert evals[-1] == _records(run_dir, "eval")[-1]
    # the probes read the model in eval mode and leave every step's loss as it was
    train_losses = [(r["step"], r["loss"]) for r in _records(got, "train")]
    assert train_losses == [(r["step"], r["loss"]) for r in _records(run_dir, "train")]
    summary = json.loads((got / "summary.json").read_text())
    assert summary["final"] == json.loads((run_dir / "summary.json").read_text())["final"]
