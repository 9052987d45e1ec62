"""The step-feature protocol (lbsgd.features): every feature has its declared place in the order
its hooks run in, and the run calls them in that order whatever order they were made in."""

import random

import pytest

from lbsgd import features


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
