"""stop_at_error (lbsgd.trainer): a run ends at the first evaluation whose held-out top-1 error
reaches the target, with a full evaluation and a checkpoint there; every step before it is the
uninterrupted run's, so the steps to the target read from either are the same."""

import json

import pytest
from conftest import TINY

from lbsgd import checkpoint, config, train
from lbsgd.config import Config, ConfigError
from lbsgd.lab.studies import steps_to_target as stt

HOLDOUT = 64  # of 1,024 synthetic training images: 960 to train on, 15 steps an epoch


def _records(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """Two epochs (30 steps), the held-out split probed at steps 1, 2, 4, 8 and 16 and evaluated
    with the test split at each epoch's end, not stopped."""
    out = tmp_path_factory.mktemp("whole")
    keys = {**TINY, "synthetic_train": 1024, "holdout": HOLDOUT, "eval_per_octave": 1}
    keys = {**keys, "epochs": 2, "eval_every": 1, "out_dir": str(out)}
    train(Config(**{**keys, "name": "w"}))
    return keys, out / "runs" / "w"


def test_a_run_ends_at_the_first_probe_that_reaches_the_target_with_the_whole_runs_steps(
    whole, tmp_path
):
    keys, whole_dir = whole
    evals = _records(whole_dir, "eval")
    assert [r["step"] for r in evals] == [1, 2, 4, 8, 15, 16, 30]
    # the target: the first evaluation after the first that is lower than every one before it
    # (the run crosses it there first), one that is a probe of the held-out split alone
    errors = [r["val_top1_error_pct"] for r in evals]
    i = next(i for i in range(1, len(errors)) if errors[i] < min(errors[:i]))
    assert "top1_error_pct" not in evals[i], "the whole run's first new low is no probe"
    target, step = errors[i], evals[i]["step"]
    cfg = Config(**{**keys, "out_dir": str(tmp_path), "name": "s", "stop_at_error": target})
    summary = train(cfg)
    got = tmp_path / "runs" / "s"
    assert summary["status"] == "completed" and summary["steps"] == step < 30
    assert summary["stopped_at_target"] == step and summary["total_steps"] == 30
    # every step up to the target is the uninterrupted run's, digit for digit
    train_got = [(r["step"], r["loss"]) for r in _records(got, "train")]
    train_whole = [(r["step"], r["loss"]) for r in _records(whole_dir, "train")]
    assert train_got == train_whole[:step]
    # its evaluations are the whole run's up to the target, then the test split at that step
    got_evals = _records(got, "eval")
    assert got_evals[: i + 1] == evals[: i + 1] and len(got_evals) == i + 2
    assert got_evals[-1]["step"] == step and "val_top1_error_pct" not in got_evals[-1]
    assert summary["final"]["val_top1_error_pct"] == target
    assert summary["final"]["top1_error_pct"] == got_evals[-1]["top1_error_pct"]
    assert checkpoint.load(got)["step"] == step
    # the steps to the target, read as study 15 reads them, are the same from either run
    assert stt.steps_to_error(got_evals, target) == stt.steps_to_error(evals, target)
    # run again: complete, nothing trained
    assert train(cfg.replace(resume=True))["steps"] == step


def test_a_target_never_reached_trains_every_step_as_the_whole_run(whole, tmp_path):
    keys, whole_dir = whole
    cfg = Config(**{**keys, "out_dir": str(tmp_path), "name": "n", "stop_at_error": 0.001})
    summary = train(cfg)
    assert summary["steps"] == 30 and "stopped_at_target" not in summary
    got = tmp_path / "runs" / "n"
    assert _records(got, "eval") == _records(whole_dir, "eval")


def test_the_key_names_its_run_only_when_set_and_is_refused_out_of_range_or_with_async_ps():
    plain = Config(**TINY)
    assert Config(**{**TINY, "stop_at_error": None}).experiment_id() == plain.experiment_id()
    assert Config(**{**TINY, "stop_at_error": 20.0}).experiment_id() != plain.experiment_id()
    for bad in (0, 100, -1):
        with pytest.raises(ConfigError, match=r"stop_at_error=.* must be a top-1 error in %"):
            config.from_dict({**TINY, "stop_at_error": bad})
    with pytest.raises(ConfigError, match="not with stop_at_error=20"):
        config.from_dict({**TINY, "async_ps": True, "resume": False, "stop_at_error": 20.0})
