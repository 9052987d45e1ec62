"""The step-feature protocol (lbsgd.features): every feature has its declared place in the order
its hooks run in, and the run calls them in that order whatever order they were made in."""

import random

import pytest

from lbsgd import config, features
from lbsgd.config import Config, ConfigError, step_features


def _every_feature_class() -> list[type]:
    found, todo = [], [features.StepFeature]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_feature_of_the_package_has_its_place_in_the_declared_order():
    names = {cls.name for cls in _every_feature_class() if cls.__module__ == features.__name__}
    assert names == set(features.ORDER)


def test_the_run_calls_its_features_in_the_declared_order_whatever_their_making_order():
    table = [type(name, (features.StepFeature,), {"name": name})() for name in features.ORDER]
    shuffled = table[:]
    random.Random(0).shuffle(shuffled)
    assert shuffled != table
    assert features.in_order(shuffled) == table


def test_a_feature_without_a_declared_place_is_refused():
    stray = type("Stray", (features.StepFeature,), {"name": "stray"})()
    with pytest.raises(ValueError, match="stray"):
        features.in_order([stray])


def test_the_table_the_builders_and_the_order_name_the_same_features():
    rows = [row.name for row in step_features.TABLE]
    assert len(rows) == len(set(rows))
    assert set(rows) == set(features.BUILDERS) == set(features.ORDER)


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
