"""The learning rate of every iteration against Goyal et al. 2017's formulas, computed by hand.

Setting of Goyal Table 1: ResNet-50 on ImageNet-1k (N = 1,281,167), kn = 8192, eta = 0.1 per 256,
so eta-hat = 0.1 * 8192 / 256 = 3.2; 5 warmup epochs; lr ÷10 at epochs 30, 60, 80 of 90.
Iterations per epoch N / kn = 156.39245...; by hand:
  warmup:     5 * 156.392456 = 781.96  -> 782 iterations
  milestones: 30 -> 4691.77 -> 4692;  60 -> 9383.55 -> 9384;  80 -> 12511.40 -> 12511
  total:      90 * 156.392456 = 14075.32 -> 14076 iterations (ceil: every sample seen 90 times)
"""

import math

import pytest

from lbsgd.config import Config, derive
from lbsgd.schedules import learning_rate

N_IMAGENET = 1_281_167
WARMUP, M30, M60, M80, TOTAL = 782, 4692, 9384, 12511, 14076


def goyal(warmup: str, **kw) -> tuple[Config, object]:
    cfg = Config(batch_size=8192, warmup=warmup, **kw)
    return cfg, derive(cfg, world_size=1, num_train=N_IMAGENET)


def step_decay(t: int) -> float:
    return 3.2 * (1.0 if t < M30 else 0.1 if t < M60 else 0.01 if t < M80 else 0.001)


def test_goyal_derived_iteration_counts_match_hand_computation():
    _, d = goyal("gradual")
    assert (d.warmup_steps, d.milestone_steps, d.total_steps) == (WARMUP, (M30, M60, M80), TOTAL)
    assert d.lr == pytest.approx(3.2, rel=1e-15)
    assert d.warmup_start_lr == 0.1


def test_gradual_warmup_every_iteration_equals_goyal_formula():
    cfg, d = goyal("gradual")
    for t in range(TOTAL):
        # Goyal §2.2: start at eta = 0.1, add (3.2 - 0.1) / 782 per iteration, reach 3.2 at t = 782
        expected = 0.1 + (3.2 - 0.1) * t / WARMUP if t < WARMUP else step_decay(t)
        assert learning_rate(t, cfg, d) == pytest.approx(expected, rel=1e-12), t
    # spot values from the issue: 0.1 at the start, 3.2 after 5 epochs, 0.32 at epoch 30
    assert learning_rate(0, cfg, d) == pytest.approx(0.1)
    assert learning_rate(391, cfg, d) == pytest.approx(1.65)  # halfway: 0.1 + 3.1 / 2
    assert learning_rate(782, cfg, d) == pytest.approx(3.2)
    assert learning_rate(4691, cfg, d) == pytest.approx(3.2)
    assert learning_rate(4692, cfg, d) == pytest.approx(0.32)


def test_constant_warmup_every_iteration_equals_goyal_formula():
    cfg, d = goyal("constant")
    for t in range(TOTAL):
        expected = 0.1 if t < WARMUP else step_decay(t)  # 0.1 for 5 epochs, then the jump to 3.2
        assert learning_rate(t, cfg, d) == pytest.approx(expected, rel=1e-12), t


def test_no_warmup_every_iteration_equals_goyal_formula():
    cfg, d = goyal("none")
    assert d.warmup_steps == 0
    for t in range(TOTAL):
        assert learning_rate(t, cfg, d) == pytest.approx(step_decay(t), rel=1e-12), t


def test_warmup_lr_overrides_the_start_of_the_ramp():
    cfg, d = goyal("gradual", warmup_lr=0.2)
    assert learning_rate(0, cfg, d) == pytest.approx(0.2)
    assert learning_rate(391, cfg, d) == pytest.approx(0.2 + 3.0 / 2)


@pytest.mark.parametrize(
    ("rule", "peak"),
    [
        ("linear", 3.2),
        ("sqrt", 0.1 * math.sqrt(32)),
        ("none", 0.1),
    ],  # Goyal Table 2a: 3.2, 0.566, 0.1
)
def test_scaling_rules_give_goyal_table2a_learning_rates(rule, peak):
    cfg, d = goyal("none", lr_scaling=rule)
    assert d.lr == pytest.approx(peak, rel=1e-12)
    assert learning_rate(0, cfg, d) == pytest.approx(peak, rel=1e-12)


def test_poly_decay_after_warmup_equals_formula():
    # You et al. 2017: lr = eta-hat * (1 - t/T)^2, here counted from the end of the warmup
    cfg = Config(batch_size=1024, schedule="poly", warmup_epochs=2, epochs=10)
    d = derive(cfg, world_size=1, num_train=10_240)  # 10 steps per epoch: warmup 20, total 100
    assert (d.warmup_steps, d.total_steps, d.lr) == (20, 100, pytest.approx(0.4))
    assert learning_rate(20, cfg, d) == pytest.approx(0.4)
    assert learning_rate(60, cfg, d) == pytest.approx(0.4 * (1 - 40 / 80) ** 2)  # 0.1
    assert learning_rate(99, cfg, d) == pytest.approx(0.4 * (1 / 80) ** 2)


def test_cosine_decay_after_warmup_equals_formula():
    cfg = Config(batch_size=1024, schedule="cosine", warmup="none", epochs=10)
    d = derive(cfg, world_size=1, num_train=10_240)
    assert learning_rate(0, cfg, d) == pytest.approx(0.4)
    assert learning_rate(50, cfg, d) == pytest.approx(0.2)  # half way: cos(pi/2) = 0
    assert learning_rate(25, cfg, d) == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_schedule_is_a_pure_function_of_the_step():
    cfg, d = goyal("gradual")
    forward = [learning_rate(t, cfg, d) for t in range(0, TOTAL, 97)]
    backward = [learning_rate(t, cfg, d) for t in reversed(range(0, TOTAL, 97))]
    assert forward == backward[::-1]


def test_a_warmup_longer_than_the_run_is_named_in_one_warning_line_and_trains():
    from lbsgd.config import Config, derive, warmup_warning

    # 512 images, batch 64: 8 steps per epoch; 3 warmup epochs are 24 steps of a 1-epoch run's 8
    cfg = Config(synthetic_train=512, batch_size=64, epochs=1, warmup_epochs=3)
    line = warmup_warning(cfg, derive(cfg, 1, 512))
    assert line == (
        "lbsgd: warning: warmup_epochs=3 is longer than the run (epochs=1: 24 warmup steps of 8): "
        "the lr never reaches its peak 0.025"
    )
    for fits in (
        Config(**{**cfg.to_dict(), "epochs": 3}),
        Config(**{**cfg.to_dict(), "warmup": "none"}),
    ):
        assert warmup_warning(fits, derive(fits, 1, 512)) is None
