"""The step-feature protocol (lbsgd.features): every feature is one row of the table
(lbsgd.config.step_features: its keys, its class, its place in the order its hooks run in) and its
class, and the run calls them in the table's order whatever order they were made in; every feature
of the table resumes bitwise after a kill and trains as its row says on another layout, so that a
new feature joins these tests with its row."""

import json
import random

import pytest
import torch
from helpers import (
    RESUME_KEYS,
    final_weights,
    killed_and_resumed,
    resume_args,
    run_fault_worker,
)

from lbsgd import config, distributed, features
from lbsgd.config import Config, ConfigError, step_features


def _every_feature_class() -> list[type]:
    found, todo = [], [features.StepFeature]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_each_row_names_its_class_and_every_feature_class_of_the_package_has_its_row():
    """A row is all a feature needs besides its class: the row names the class (which the run
    makes it with), its name and its place in the order are the row's."""
    rows = step_features.TABLE
    classes = [c for c in _every_feature_class() if c.__module__ == features.__name__]
    assert len({row.name for row in rows}) == len(rows) == len(classes)
    assert {row.cls: features.CLASSES[row.cls] for row in rows} == {c.__name__: c for c in classes}


def test_a_run_makes_every_feature_it_carries_from_its_row_in_the_tables_order():
    keys = {k: v for row in step_features.TABLE for k, v in row.example.items()}
    cfg = Config(**{**keys, "local_sgd": 0, "comm_hook": "none"})  # each combinable with the rest
    ctx = distributed.Context(0, 1, 0, 1, torch.device("cpu"))
    params = [torch.zeros(3, requires_grad=True)]
    parts = features.Parts(cfg=cfg, d=config.derive(cfg, 1, 32_000), params=params, ctx=ctx)
    made = features.made("before_wrap", parts)
    rows = [r for r in step_features.TABLE if r.stage == "before_wrap"]
    assert [(type(f).__name__, f.name) for f in made] == [(r.cls, r.name) for r in rows]
    assert len(made) == 3


def test_the_run_calls_its_features_in_the_tables_order_whatever_their_making_order():
    order = [row.name for row in step_features.TABLE]
    table = [type(name, (features.StepFeature,), {"name": name})() for name in order]
    shuffled = table[:]
    random.Random(0).shuffle(shuffled)
    assert shuffled != table
    assert features.in_order(shuffled) == table


def test_a_feature_without_a_declared_place_is_refused():
    stray = type("Stray", (features.StepFeature,), {"name": "stray"})()
    with pytest.raises(ValueError, match="stray"):
        features.in_order([stray])


def test_a_feature_hands_its_flush_values_from_one_hook_and_one_from_both_is_refused():
    early_one = type("Early", (features.StepFeature,), {"name": "noise_scale"})()
    late_one = type("Late", (features.StepFeature,), {"name": "grad_clip"})()
    a, b = torch.tensor([1.0]), torch.tensor([2.0])
    got = features.step_values([early_one, late_one], [a, None], [None, b])
    assert got[0] is a and got[1] is b
    with pytest.raises(RuntimeError, match=r"\['grad_clip'\] return flush values from both"):
        features.step_values([early_one, late_one], [a, a], [None, b])


@pytest.mark.parametrize("row", step_features.TABLE, ids=lambda row: row.name)
def test_each_feature_is_asked_by_its_keys_and_refused_under_async_ps_in_one_line(row):
    asking = Config(**row.example)
    assert row.asked(asking) and not row.asked(Config())
    with pytest.raises(ConfigError) as refused:
        config.from_dict({**row.example, "async_ps": True, "resume": False})
    assert str(refused.value) == row.async_ps_refusal(asking)
    assert "\n" not in str(refused.value) and f"(valid: {row.off})" in str(refused.value)


def test_a_run_carries_a_feature_as_its_keys_and_processes_say():
    rows = {row.name: row for row in step_features.TABLE}
    one, two = (config.derive(Config(local_sgd=2), k, 32_000) for k in (1, 2))
    assert not rows["local_sgd"].carried_by(Config(local_sgd=2), one)  # alone: nothing to average
    assert rows["local_sgd"].carried_by(Config(local_sgd=2), two)
    bmuf = Config(local_sgd=2, block_momentum=0.5)
    assert rows["local_sgd"].carried_by(bmuf, config.derive(bmuf, 1, 32_000))  # BMUF's filter
    hook = Config(comm_hook="powersgd")
    assert not rows["powersgd"].carried_by(hook, config.derive(hook, 1, 32_000))  # no DDP


def test_the_processes_are_part_of_a_run_exactly_where_a_feature_of_it_is_not_layout_free():
    """config.world_size_key (a run resumed, counted as done or copied only on as many processes
    as trained it) follows the table: the key of each row that is not layout-free."""
    for row in step_features.TABLE:
        key = config.world_size_key(Config(**row.example))
        assert key == (None if row.layout_free else row.key), row.name
    assert config.world_size_key(Config(comm_hook="powersgd")) == "comm_hook"
    assert config.world_size_key(Config()) is None


def _train_records(run_dir) -> list[dict]:
    """Every train record of a run, less its clock (img_per_s)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in r.items() if k != "img_per_s"}
        for r in map(json.loads, lines)
        if r["kind"] == "train"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("row", step_features.TABLE, ids=lambda row: row.name)
def test_each_feature_resumes_bitwise_after_a_kill_and_trains_on_another_layout_as_declared(
    row, tmp_path
):
    """The 16-step run with the row's keys on 2 processes accumulating 2 micro-batches each, its
    last rank killed (SIGKILL) before step 11: resumed from step 9's checkpoint, it ends bitwise
    where the uninterrupted run does, every train record (the feature's fields included) the
    same. Then the same run on 1 process accumulating 4: the 2 processes' weights up to float
    reordering where the row says the feature is layout-free, otherwise far from them."""
    keys = {**row.example, "micro_batch": 8}
    cfg = Config(**{**RESUME_KEYS, **keys})
    assert row.carried_by(cfg, config.derive(cfg, 2, cfg.synthetic_train))  # there on 2 processes
    killed_and_resumed(tmp_path, "f", nproc=2, **keys)
    straight = tmp_path / "straight" / "runs" / "f"
    assert _train_records(tmp_path / "runs" / "f") == _train_records(straight)
    one = run_fault_worker(resume_args(tmp_path / "one", "f", **keys))
    assert one.returncode == 0, one.stderr[-3000:]
    one, two = final_weights(tmp_path / "one" / "runs" / "f"), final_weights(straight)
    # the all-reduce and the accumulation add the same gradients in another order: equal up to
    # float reordering over 16 steps (tests/test_distributed.py), where a layout-bound feature
    # moves some weight by far more
    if row.layout_free:
        for k, value in two.items():
            torch.testing.assert_close(one[k], value, rtol=1e-4, atol=1e-5, msg=k)
    else:
        assert max((one[k].double() - two[k].double()).abs().max().item() for k in two) > 1e-3
