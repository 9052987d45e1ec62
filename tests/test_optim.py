"""SGD with the lr inside the velocity (Goyal et al. 2017 §3, eq. 10), LARS (You et al. 2017,
Algorithm 1) and the decay / no-decay parameter groups (Jia et al. 2018), against the formulas.

LARS numbers are worked out by hand below from w = [3, 4] (‖w‖ = 5) and g = [0.3, 0.4] (‖g‖ = 0.5)
with trust coefficient η = 0.001, weight decay β = 0.01, momentum m = 0.9, global lr γ = 2:
  λ = η·‖w‖ / (‖g‖ + β·‖w‖) = 0.001·5 / (0.5 + 0.05) = 0.005 / 0.55 = 1/110
  v = γ·λ·(g + β·w) = 2/110 · [0.33, 0.44] = [0.006, 0.008];  w ← [2.994, 3.992]
"""

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lbsgd import config, models, optim
from lbsgd.config import Config, ConfigError, optimizers
from lbsgd.optim import (
    LAMB,
    LARS,
    SGD,
    AdamW,
    build,
    describe_groups,
    lamb_trust_ratio,
    lars_trust_ratio,
    param_groups,
)

# Goyal §2.2 gradual warmup in miniature: 0.1 → 3.2 over 10 steps (a new lr every step), then the
# peak, then ÷10 (§5.1's step decay).
WARMUP_RAMP = [0.1 + (3.2 - 0.1) * t / 10 for t in range(10)] + [3.2] * 4 + [0.32] * 4


def mlp(dtype=torch.float64) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A fixed tiny regression problem whose gradients depend on the weights (so trajectories
    matter); inputs scaled so that lr 3.2 stays stable."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * 0.5)
    x = torch.randn(32, 6, generator=g, dtype=dtype) * 0.3
    y = torch.randn(32, 3, generator=g, dtype=dtype) * 0.3
    return model, x, y


def groups_of(model: nn.Module, wd: float) -> list[dict]:
    # Weight matrices decayed, biases not: both kinds of group go through the optimizers.
    return [
        {"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": wd},
        {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0},
    ]


def trajectory(opt, model, x, y, lrs, scale: float = 1.0) -> list[torch.Tensor]:
    """Parameters (flattened) after each step, the lr set before each step as the trainer does;
    ``scale`` multiplies the loss (and so every gradient)."""
    out = []
    for lr in lrs:
        optim.set_lr(opt, lr)
        opt.zero_grad()
        (scale * nn.functional.mse_loss(model(x), y)).backward()
        opt.step()
        out.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    return out


def torch_and_ours(nesterov: bool, correction: bool, lrs: list[float], wd: float = 0.01):
    model, x, y = mlp()
    twin = copy.deepcopy(model)
    ref = torch.optim.SGD(groups_of(model, wd), lr=lrs[0], momentum=0.9, nesterov=nesterov)
    ours = SGD(
        groups_of(twin, wd),
        lr=lrs[0],
        momentum=0.9,
        nesterov=nesterov,
        momentum_correction=correction,
    )
    return trajectory(ref, model, x, y, lrs), trajectory(ours, twin, x, y, lrs)


# -- SGD: Goyal eq. (10) and momentum correction ----------------------------------------------


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_with_momentum_correction_equals_torch_sgd_over_warmup_ramp(nesterov):
    ref, ours = torch_and_ours(nesterov, correction=True, lrs=WARMUP_RAMP)
    for t, (a, b) in enumerate(zip(ref, ours, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12, msg=f"step {t}")
    assert (ref[-1] - ref[0]).abs().max() > 0.1  # the weights did move: the check has teeth


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_without_momentum_correction_departs_from_torch_once_lr_changes(nesterov):
    ref, ours = torch_and_ours(nesterov, correction=False, lrs=WARMUP_RAMP)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-12, atol=1e-14)  # no history yet
    # From the second step the velocity still holds gradients scaled by the older, smaller lr.
    # Gap relative to the size of torch's step t (w_t − w_{t−1}), over the ramp.
    gap = [
        ((ours[t] - ref[t]).abs().max() / (ref[t] - ref[t - 1]).abs().max()).item()
        for t in range(1, 10)
    ]
    assert min(gap) > 0.05, gap
    assert (ours[-1] - ref[-1]).abs().max() > 1e-2


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_without_momentum_correction_equals_torch_at_constant_lr(nesterov):
    ref, ours = torch_and_ours(nesterov, correction=False, lrs=[0.5] * 12)
    for t, (a, b) in enumerate(zip(ref, ours, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12, msg=f"step {t}")


def test_sgd_step_after_lr_zero_does_not_divide_by_zero():
    # Goyal's ratio η_{t+1}/η_t does not exist after η_t = 0; the corrected velocity is 0 there.
    w = nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = SGD([w], lr=0.5, momentum=0.9)
    for lr in (0.5, 0.0, 0.5):
        optim.set_lr(opt, lr)
        w.grad = torch.tensor([1.0, 1.0])
        opt.step()
    # v1 = 0.5·g = 0.5; v2 = 0.9·(0/0.5)·0.5 + 0 = 0; v3 = 0.9·0 + 0.5·g = 0.5 (ratio left at 1)
    torch.testing.assert_close(opt.state[w]["momentum_buffer"], torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(w.detach(), torch.tensor([0.0, 1.0]))


# -- LARS: You et al. 2017 Algorithm 1, by hand ------------------------------------------------


def test_lars_trust_ratio_equals_formula_and_guards_zero_norms():
    w_norm = torch.tensor([5.0, 0.0, 5.0, 0.0])
    g_norm = torch.tensor([0.5, 1.0, 0.0, 0.0])
    ratio = lars_trust_ratio(w_norm, g_norm, eta=0.001, weight_decay=0.01)
    # 0.001·5/(0.5 + 0.01·5) = 1/110; then ‖w‖ = 0, ‖g‖ = 0, both: λ = 1
    torch.testing.assert_close(ratio, torch.tensor([1 / 110, 1.0, 1.0, 1.0]))
    # β = 0 and ‖g‖ = 0 would be 0/0 without the guard
    assert torch.isfinite(lars_trust_ratio(w_norm, g_norm, eta=0.001, weight_decay=0.0)).all()


@pytest.mark.parametrize("correction", [True, False])
def test_lars_three_steps_with_changing_lr_equal_hand_computation(correction):
    eta, beta, m = 0.001, 0.01, 0.9
    w = nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = LARS(
        [w],
        lr=2.0,
        momentum=m,
        weight_decay=beta,
        trust_coefficient=eta,
        momentum_correction=correction,
    )
    g = [0.3, 0.4]  # ‖g‖ = 0.5 at every step
    w_ref, v_ref, lr_prev = [3.0, 4.0], [0.0, 0.0], None
    for step, lr in enumerate((2.0, 4.0, 0.4)):  # doubled, then ÷10
        optim.set_lr(opt, lr)
        w.grad = torch.tensor(g)
        opt.step()
        w_norm = math.hypot(*w_ref)
        local = eta * w_norm / (0.5 + beta * w_norm)  # λ
        scale = lr / lr_prev if correction and lr_prev else 1.0  # Goyal eq. (10)
        v_ref = [
            m * scale * v + lr * local * (gi + beta * wi)
            for v, gi, wi in zip(v_ref, g, w_ref, strict=True)
        ]
        w_ref = [wi - v for wi, v in zip(w_ref, v_ref, strict=True)]
        lr_prev = lr
        if step == 0:  # the worked example of the module docstring, as literal numbers
            assert local == pytest.approx(1 / 110) and local == pytest.approx(0.0090909, rel=1e-5)
            assert v_ref == pytest.approx([0.006, 0.008]) and w_ref == pytest.approx([2.994, 3.992])
        torch.testing.assert_close(opt.state[w]["momentum_buffer"], torch.tensor(v_ref))
        torch.testing.assert_close(w.detach(), torch.tensor(w_ref), msg=f"step {step}")


def test_lars_second_step_with_correction_literal_numbers():
    w = nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = LARS([w], lr=2.0, momentum=0.9, weight_decay=0.01, trust_coefficient=0.001)
    for lr in (2.0, 4.0):
        optim.set_lr(opt, lr)
        w.grad = torch.tensor([0.3, 0.4])
        opt.step()
    # ‖w1‖ = ‖[2.994, 3.992]‖ = 4.99 exactly (3-4-5 triangle scaled by 0.998);
    # λ2 = 0.001·4.99/(0.5 + 0.0499) = 0.00499/0.5499; g + βw1 = [0.32994, 0.43992]
    lam2 = 0.00499 / 0.5499
    v2 = [0.9 * 2 * 0.006 + 4 * lam2 * 0.32994, 0.9 * 2 * 0.008 + 4 * lam2 * 0.43992]
    assert v2 == pytest.approx([0.0227762, 0.0303683], rel=1e-5)
    torch.testing.assert_close(opt.state[w]["momentum_buffer"], torch.tensor(v2))
    torch.testing.assert_close(w.detach(), torch.tensor([2.994 - v2[0], 3.992 - v2[1]]))


def test_lars_nesterov_step_equals_hand_computation():
    w = nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = LARS([w], lr=2.0, momentum=0.9, weight_decay=0.01, nesterov=True)
    w.grad = torch.tensor([0.3, 0.4])
    opt.step()
    # w ← w − (γλ(g + βw) + m·v) with v = γλ(g + βw) = [0.006, 0.008]: w − 1.9·[0.006, 0.008]
    torch.testing.assert_close(w.detach(), torch.tensor([3 - 0.0114, 4 - 0.0152]))


def test_lars_zero_norm_tensors_and_excluded_group_equal_hand_computation():
    zero_w = nn.Parameter(torch.zeros(2))  # e.g. a γ=0 BN weight under decay_bn_bias=true
    zero_g = nn.Parameter(torch.tensor([3.0, 4.0]))
    bias = nn.Parameter(torch.tensor([1.0, -1.0]))  # no-decay group: neither β nor λ
    opt = LARS(
        [{"params": [zero_w, zero_g]}, {"params": [bias], "weight_decay": 0.0, "adapt": False}],
        lr=2.0,
        momentum=0.9,
        weight_decay=0.01,
        trust_coefficient=0.001,
    )
    zero_w.grad, zero_g.grad = torch.tensor([1.0, -2.0]), torch.zeros(2)
    bias.grad = torch.tensor([0.5, 0.25])
    opt.step()
    # ‖w‖ = 0 → λ = 1: v = 2·([1, -2] + 0.01·0) = [2, -4]  (λ = 0 would leave it at 0 forever)
    torch.testing.assert_close(zero_w.detach(), torch.tensor([-2.0, 4.0]))
    # ‖g‖ = 0 → λ = 1: v = 2·(0 + 0.01·[3, 4]) = [0.06, 0.08]  (unguarded λ = 0.1 gives 0.006)
    torch.testing.assert_close(zero_g.detach(), torch.tensor([2.94, 3.92]))
    # adapt=False, β = 0: v = γ·g = [1, 0.5]
    torch.testing.assert_close(bias.detach(), torch.tensor([0.0, -1.5]))
    optim.set_lr(opt, 4.0)
    bias.grad = torch.tensor([0.5, 0.25])
    zero_w.grad, zero_g.grad = None, None  # params without a gradient are skipped
    opt.step()
    # corrected: v = 0.9·(4/2)·[1, 0.5] + 4·[0.5, 0.25] = [3.8, 1.9]
    torch.testing.assert_close(bias.detach(), torch.tensor([0.0 - 3.8, -1.5 - 1.9]))
    torch.testing.assert_close(zero_w.detach(), torch.tensor([-2.0, 4.0]))


# -- both optimizers through the same numeric test (timm's habit) ----------------------------


def make_opt(kind: str, params, **kw):
    if kind == "sgd":
        return SGD(params, **{"lr": 0.05, "momentum": 0.9, **kw})
    if kind == "lamb":
        return LAMB(params, **{"lr": 0.1, **kw})
    if kind == "adamw":
        return AdamW(params, **{"lr": 0.1, **kw})
    return LARS(params, **{"lr": 10.0, "momentum": 0.9, "trust_coefficient": 0.001, **kw})


KINDS = ["sgd", "lars", "lamb", "adamw"]


@pytest.mark.parametrize("kind", KINDS)
def test_optimizer_solves_least_squares(kind):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 10, generator=g)
    y = x @ torch.randn(10, 1, generator=g)
    w = nn.Parameter(torch.randn(10, 1, generator=g))
    opt = make_opt(kind, [w])
    losses = []
    for _ in range(50):
        opt.zero_grad()
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 100, (losses[0], losses[-1])


@pytest.mark.parametrize("kind", ["sgd", "lars"])
def test_optimizer_first_step_equals_hand_formula(kind):
    w = nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = make_opt(kind, [w], lr=2.0, weight_decay=0.01)
    w.grad = torch.tensor([0.3, 0.4])
    opt.step()
    local = 1.0 if kind == "sgd" else 0.001 * 5 / (0.5 + 0.01 * 5)  # λ = 1/110 for LARS
    expected = [3 - 2 * local * (0.3 + 0.01 * 3), 4 - 2 * local * (0.4 + 0.01 * 4)]
    torch.testing.assert_close(w.detach(), torch.tensor(expected))


@pytest.mark.parametrize("kind", KINDS)
def test_resume_from_state_dict_continues_exactly(kind):
    lrs = WARMUP_RAMP[:8] if kind in ("sgd", "lars") else [lr / 100 for lr in WARMUP_RAMP[:8]]
    model, x, y = mlp()
    whole = trajectory(make_opt(kind, groups_of(model, 0.01), lr=lrs[0]), model, x, y, lrs)
    model, x, y = mlp()
    first = make_opt(kind, groups_of(model, 0.01), lr=lrs[0])
    trajectory(first, model, x, y, lrs[:4])
    saved = copy.deepcopy(first.state_dict())
    if kind in ("sgd", "lars"):
        assert saved["param_groups"][0]["last_lr"] == lrs[3]  # what the correction reads next
    else:
        assert saved["param_groups"][0]["step"] == 4  # what the bias correction reads next
    resumed = make_opt(kind, groups_of(model, 0.01), lr=99.0)
    resumed.load_state_dict(saved)
    rest = trajectory(resumed, model, x, y, lrs[4:])
    for a, b in zip(whole[4:], rest, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: SGD(p, lr=-0.1), "lr=-0.1"),
        (lambda p: SGD(p, momentum=1.0), "momentum=1.0"),
        (lambda p: SGD(p, weight_decay=-1e-4), "weight_decay=-0.0001"),
        (lambda p: SGD(p, momentum=0.0, nesterov=True), "nesterov"),
        (lambda p: LARS(p, momentum=-0.5), "momentum=-0.5"),
        (lambda p: LARS(p, trust_coefficient=0.0), "trust_coefficient=0.0"),
        (lambda p: LAMB(p, betas=(1.0, 0.999)), "adam_beta1=1.0"),
        (lambda p: AdamW(p, betas=(0.9, -0.1)), "adam_beta2=-0.1"),
        (lambda p: LAMB(p, eps=0.0), "eps=0.0"),
        (lambda p: AdamW(p, lr=-1.0), "lr=-1.0"),
    ],
)
def test_bad_arguments_raise_one_line_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match) as e:
        make([nn.Parameter(torch.zeros(2))])
    assert "\n" not in str(e.value)


# -- parameter groups: by module type and tensor shape (Jia et al. 2018) --------------------


def norm_and_fc_bias(model: nn.Module, fc: nn.Linear) -> list[nn.Parameter]:
    """The expected no-decay set, walked by module type: BN γ/β of every BN, plus the FC bias."""
    bn = [p for m in model.modules() if isinstance(m, _BatchNorm) for p in m.parameters(False)]
    return [*bn, fc.bias]


def tensors_and_count(params) -> str:
    return f"{len(params)} tensors / {sum(p.numel() for p in params):,} params"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["resnet", "resnet18"])
def test_no_decay_group_is_exactly_bn_parameters_and_fc_bias(arch, kind):
    spec = SimpleNamespace(model=arch, depth=8, width=8, zero_init_residual=False)
    model = models.build(spec, 10, 32 if arch == "resnet18" else 16)
    opt = build(Config(optimizer=kind, weight_decay=1e-4, lars_eta=0.002), model)
    decay, no_decay = opt.param_groups
    expected = norm_and_fc_bias(model, model.fc)
    assert {id(p) for p in no_decay["params"]} == {id(p) for p in expected}
    assert len(no_decay["params"]) == len(expected)
    rest = [p for p in model.parameters() if id(p) not in {id(q) for q in expected}]
    assert [id(p) for p in decay["params"]] == [id(p) for p in rest]  # conv and FC weights
    assert all(p.ndim in (2, 4) for p in decay["params"])
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (1e-4, 0.0)
    adapts = kind in ("lars", "lamb")
    labels = ("decay+adapt", "no decay/adapt") if adapts else ("decay", "no decay")
    assert describe_groups(opt) == (
        f"parameter groups: {labels[0]} {tensors_and_count(rest)}; "
        f"{labels[1]} (bias, norm) {tensors_and_count(expected)}"
    )
    if kind == "lars":
        assert isinstance(opt, LARS) and (decay["adapt"], no_decay["adapt"]) == (True, False)
        assert decay["trust_coefficient"] == 0.002
    elif kind == "lamb":
        assert type(opt) is LAMB and (decay["adapt"], no_decay["adapt"]) == (True, False)
    elif kind == "adamw":
        assert type(opt) is AdamW and (decay["adapt"], no_decay["adapt"]) == (False, False)
    else:
        assert type(opt) is SGD and "adapt" not in decay


def test_cifar_resnet8_describe_groups_equals_hand_count():
    # ResNet-8, width 8, 10 classes. Decayed: stem 3·8·9 = 216; stage 1: 2·8·8·9 = 1,152;
    # stage 2: 8·16·9 + 16·16·9 + 8·16 (projection) = 3,584; stage 3: 16·32·9 + 32·32·9 + 16·32
    # = 14,336; FC 32·10 = 320 → 10 tensors, 19,608 params. Not decayed: 9 BNs × (γ, β) at widths
    # 8, 8, 8, 16, 16, 16, 32, 32, 32 → 2·168 = 336, plus the FC bias 10 → 19 tensors, 346 params.
    spec = SimpleNamespace(model="resnet", depth=8, width=8, zero_init_residual=False)
    opt = build(Config(optimizer="lars"), models.build(spec, 10, 16))
    assert describe_groups(opt) == (
        "parameter groups: decay+adapt 10 tensors / 19,608 params; "
        "no decay/adapt (bias, norm) 19 tensors / 346 params"
    )


class ScaledConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.channel_scale = nn.Parameter(torch.ones(4))  # 1-D, not called bias, not in a norm
        self.norm = nn.GroupNorm(2, 4)


def test_one_dimensional_parameter_goes_to_no_decay_by_shape():
    model = ScaledConv()
    decay, no_decay = param_groups(model, Config())
    assert [id(p) for p in decay["params"]] == [id(model.conv.weight)]
    assert {id(p) for p in no_decay["params"]} == {
        id(model.channel_scale),
        id(model.norm.weight),
        id(model.norm.bias),
    }


def test_decay_bn_bias_true_gives_one_group_with_everything():
    model = ScaledConv()
    (group,) = param_groups(model, Config(decay_bn_bias=True, weight_decay=5e-4))
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]
    assert (group["weight_decay"], group["adapt"]) == (5e-4, True)


@pytest.mark.parametrize(
    ("decay_bn_bias", "adapt_bn_bias", "bn_bias_group"),
    [
        (False, True, (0.0, True)),  # Jia's slide: only the decay changes, LARS keeps adapting
        (True, False, (5e-4, False)),  # decayed, but stepping at the raw global lr
        (False, None, (0.0, False)),  # the default: as decay_bn_bias (today's no-decay group)
    ],
)
def test_adapt_bn_bias_decides_the_trust_ratio_apart_from_the_decay(
    decay_bn_bias, adapt_bn_bias, bn_bias_group
):
    model = ScaledConv()
    cfg = Config(
        optimizer="lars",
        decay_bn_bias=decay_bn_bias,
        adapt_bn_bias=adapt_bn_bias,
        weight_decay=5e-4,
    )
    decay, bn_bias = param_groups(model, cfg)
    assert [id(p) for p in decay["params"]] == [id(model.conv.weight)]
    assert (decay["weight_decay"], decay["adapt"]) == (5e-4, True)
    assert (bn_bias["weight_decay"], bn_bias["adapt"]) == bn_bias_group
    # the default changes no run's name; set, it does
    if adapt_bn_bias is None:
        assert cfg.experiment_id() == Config(optimizer="lars", weight_decay=5e-4).experiment_id()
    else:
        assert (
            cfg.experiment_id()
            != Config(
                optimizer="lars", decay_bn_bias=decay_bn_bias, weight_decay=5e-4
            ).experiment_id()
        )


def test_adapt_bn_bias_is_refused_without_a_trust_ratio():
    with pytest.raises(
        ConfigError, match="adapt_bn_bias=True has no effect unless optimizer=lars or lamb"
    ):
        config.from_dict({"optimizer": "sgd", "adapt_bn_bias": True})


def test_empty_group_is_dropped_and_frozen_parameters_left_out():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 2))
    model[1].requires_grad_(False)
    (group,) = param_groups(model, Config())
    assert [id(p) for p in group["params"]] == [id(model[0].weight)]


def test_build_sets_hyperparameters_from_config():
    cfg = Config(
        optimizer="sgd",
        base_lr=0.3,
        momentum=0.8,
        nesterov=False,
        weight_decay=5e-5,
        momentum_correction=False,
    )
    opt = build(cfg, nn.Linear(3, 2))
    for g in opt.param_groups:
        assert (g["lr"], g["momentum"], g["nesterov"], g["momentum_correction"]) == (
            0.3,
            0.8,
            False,
            False,
        )
    assert [g["weight_decay"] for g in opt.param_groups] == [5e-5, 0.0]
    optim.set_lr(opt, 1.5)
    assert [g["lr"] for g in opt.param_groups] == [1.5, 1.5]


def test_build_sets_adam_keys_from_config():
    cfg = Config(
        optimizer="lamb", adam_beta1=0.8, adam_beta2=0.99, adam_eps=1e-8, weight_decay=0.01
    )
    opt = build(cfg, nn.Linear(3, 2))
    assert type(opt) is LAMB
    assert [(g["betas"], g["eps"], g["adapt"]) for g in opt.param_groups] == [
        ((0.8, 0.99), 1e-8, True),
        ((0.8, 0.99), 1e-8, False),
    ]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert type(build(cfg.replace(optimizer="adamw"), nn.Linear(3, 2))) is AdamW


# -- the optimizers' table (lbsgd.config.optimizers) --------------------------------------------

OTHER_VALUE = {  # a value other than the default for each optimizer-specific key
    "momentum": 0.8,
    "nesterov": False,
    "momentum_correction": False,
    "lars_eta": 0.01,
    "adam_beta1": 0.8,
    "adam_beta2": 0.99,
    "adam_eps": 1e-8,
    "adapt_bn_bias": True,
}
OPTIMIZER_KEYS = sorted(OTHER_VALUE)


def test_optimizer_table_is_the_key_values_and_every_row_builds_its_own_class():
    assert (
        config.schema.hints()["optimizer"].__args__
        == optimizers.NAMES
        == ("sgd", "lars", "lamb", "adamw")
    )
    assert set(optim.CLASSES) == {row.cls for row in optimizers.TABLE}
    assert {k for row in optimizers.TABLE for k in row.keys} | {"adapt_bn_bias"} == set(OTHER_VALUE)
    for row in optimizers.TABLE:
        assert type(build(Config(optimizer=row.name), nn.Linear(3, 2))) is optim.CLASSES[row.cls]
    assert config.FIELDS["optimizer"].metadata["help"] == (
        "sgd (lr inside the velocity, Goyal eq. 10), lars (You et al. 2017, Algorithm 1), lamb "
        "(You et al. 2019, Algorithm 2) or adamw (Adam, decay w <- w - lr*lambda*w)"
    )
    with pytest.raises(
        ValueError, match="^optimizer='adam' is not one of: sgd, lars, lamb, adamw$"
    ):
        optimizers.info("adam")


@pytest.mark.parametrize("name", optimizers.NAMES)
def test_optimizer_reads_exactly_the_keys_of_its_row_and_refuses_the_others(name):
    """A key of the row changes the optimizer built; a key of another row changes nothing and is
    refused in one line naming the optimizers that read it."""
    row = optimizers.info(name)
    base = Config(optimizer=name, decay_bn_bias=False)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    made = build(base, net).state_dict()["param_groups"]
    for key in OPTIMIZER_KEYS:
        reads = key in row.keys or (key == "adapt_bn_bias" and row.adapts_per_layer)
        assert (name in optimizers.readers(key)) is reads, key
        refusal = f"^{key}=.* has no effect unless optimizer="
        if not reads and key in optimizers.ALWAYS_REFUSED:  # refused in any Config
            with pytest.raises(ConfigError, match=refusal):
                base.replace(**{key: OTHER_VALUE[key]})
            continue
        other = build(base.replace(**{key: OTHER_VALUE[key]}), net).state_dict()
        assert (other["param_groups"] != made) is reads, key
        if not reads:  # refused where given explicitly (a YAML file, a key=value)
            with pytest.raises(ConfigError, match=refusal):
                config.check_ignored(base.replace(**{key: OTHER_VALUE[key]}), [key])


@pytest.mark.parametrize("name", optimizers.NAMES)
def test_adapts_per_layer_is_an_update_that_scales_with_the_tensor_norm(name):
    """Two tensors with the same gradient, one ten times the other: a per-layer trust ratio
    (LARS, LAMB) makes the larger one's first step ten times as long; the others step alike."""
    w = torch.tensor([3.0, 4.0], dtype=torch.float64)
    a, b = nn.Parameter(w.clone()), nn.Parameter(10 * w)
    cfg = Config(optimizer=name, weight_decay=0.0, nesterov=False)
    opt = optim.CLASSES[optimizers.info(name).cls].from_config(
        [{"params": [a, b], "weight_decay": 0.0, "adapt": True}], cfg
    )
    optim.set_lr(opt, 0.5)
    a.grad, b.grad = torch.tensor([0.3, 0.4]).double(), torch.tensor([0.3, 0.4]).double()
    opt.step()
    ratio = float((b - 10 * w).norm() / (a - w).norm())
    assert ratio == pytest.approx(10.0 if optimizers.info(name).adapts_per_layer else 1.0)


# -- LAMB (You et al. 2019, Algorithm 2) and AdamW ---------------------------------------------
#
# By hand, w = [3, 4] (‖w‖ = 5), g = [0.3, 0.4], β1 = 0.9, β2 = 0.999, λ = 0.01, η = 2 at step 1:
#   m = 0.1·g, v = 0.001·g²; bias-corrected m̂ = g, √v̂ = |g|: r = g / (|g| + ε) = [1, 1] (ε → 0)
#   u = r + λ·w = [1.03, 1.04];  ‖u‖ = √(1.0609 + 1.0816) = √2.1425 = 1.4637281...
#   LAMB:  w ← w − η·(‖w‖/‖u‖)·u = [3, 4] − 2·(5/1.4637281)·[1.03, 1.04] = [-4.0368, -3.1051]
#   AdamW: w ← w − η·u = [3 − 2.06, 4 − 2.08] = [0.94, 1.92]


def adam_by_hand(w, grads, lrs, *, beta1=0.9, beta2=0.999, eps=1e-6, wd=0.01, adapt=True):
    """Algorithm 2 of You et al. 2019 on one tensor, element by element in Python floats."""
    w, m, v = list(w), [0.0] * len(w), [0.0] * len(w)
    for t, (g, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        m = [beta1 * a + (1 - beta1) * b for a, b in zip(m, g, strict=True)]
        v = [beta2 * a + (1 - beta2) * b * b for a, b in zip(v, g, strict=True)]
        r = [
            (a / (1 - beta1**t)) / (math.sqrt(b / (1 - beta2**t)) + eps)
            for a, b in zip(m, v, strict=True)
        ]
        u = [a + wd * x for a, x in zip(r, w, strict=True)]
        w_norm, u_norm = math.hypot(*w), math.hypot(*u)
        ratio = w_norm / u_norm if adapt and w_norm > 0 and u_norm > 0 else 1.0
        w = [x - lr * ratio * a for x, a in zip(w, u, strict=True)]
    return w


def test_lamb_and_adamw_first_step_literal_numbers():
    for kind, expected in (("lamb", [-4.0368, -3.1051]), ("adamw", [0.94, 1.92])):
        w = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
        opt = make_opt(kind, [w], lr=2.0, weight_decay=0.01, eps=1e-12)
        w.grad = torch.tensor([0.3, 0.4], dtype=torch.float64)
        opt.step()
        torch.testing.assert_close(w.detach().tolist(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["lamb", "adamw"])
def test_lamb_and_adamw_three_steps_with_changing_lr_equal_hand_computation(kind):
    grads = [[0.3, 0.4], [-0.2, 0.05], [0.01, -0.3]]
    lrs = [0.5, 1.0, 0.25]
    w = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    opt = make_opt(kind, [w], lr=lrs[0], weight_decay=0.01)
    for g, lr in zip(grads, lrs, strict=True):
        optim.set_lr(opt, lr)
        w.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    expected = adam_by_hand([3.0, 4.0], grads, lrs, adapt=kind == "lamb")
    torch.testing.assert_close(w.detach().tolist(), expected, rtol=1e-12, atol=1e-12)
    assert opt.param_groups[0]["step"] == 3


def test_lamb_trust_ratio_guards_zero_norms():
    w_norm = torch.tensor([5.0, 0.0, 2.0, 0.0])
    u_norm = torch.tensor([0.5, 1.0, 0.0, 0.0])
    torch.testing.assert_close(lamb_trust_ratio(w_norm, u_norm), torch.tensor([10.0, 1, 1, 1]))
    # a zero tensor (γ = 0 BN weight under decay_bn_bias=true) moves by η·r: ratio 1, not 0
    zero = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = LAMB([zero], lr=0.1, weight_decay=0.01, eps=1e-12)
    zero.grad = torch.tensor([0.5, -0.25], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(zero.detach().tolist(), [-0.1, 0.1], rtol=0, atol=1e-9)
    # a zero gradient with no decay: u = 0, the ratio is 1 and nothing moves (no 0/0)
    still = nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = LAMB([still], lr=0.1, weight_decay=0.0)
    still.grad = torch.zeros(2)
    opt.step()
    assert still.detach().tolist() == [1.0, 2.0]


def reference_trajectories(ours, ref, lrs, adapt_biases=False, scale=1.0):
    """(reference, ours) over ``lrs`` from the same start; our bias group adapts as
    :func:`param_groups` says (no, with decay_bn_bias=false) unless ``adapt_biases``."""
    model, x, y = mlp()
    twin = copy.deepcopy(model)
    mine = groups_of(twin, 0.01)
    mine[1]["adapt"] = adapt_biases
    return trajectory(ref(groups_of(model, 0.01)), model, x, y, lrs, scale), trajectory(
        ours(mine), twin, x, y, lrs, scale
    )


RAMP_SMALL = [lr / 100 for lr in WARMUP_RAMP]  # the warmup ramp at Adam's scale of lr


def timm_lamb(**kw):
    from timm.optim import Lamb  # the test-only reference

    return lambda g: Lamb(g, lr=RAMP_SMALL[0], eps=1e-6, foreach=False, **kw)


def ours_lamb(g):
    return LAMB(g, lr=RAMP_SMALL[0], eps=1e-6)


def test_lamb_equals_timm_lamb_without_gradient_clipping():
    """timm.optim.Lamb (an independent implementation: NVIDIA's FusedLAMB in Python) with its
    global gradient-norm clipping off (max_grad_norm=None; Algorithm 2 has none): the same
    iterates, the undecayed group (biases, λ = 0) unadapted in both."""
    ref, ours = reference_trajectories(ours_lamb, timm_lamb(max_grad_norm=None), RAMP_SMALL)
    for a, b in zip(ref, ours, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


def test_lamb_known_differences_from_timm():
    """timm's default clips the global gradient norm at 1 (max_grad_norm=1.0); and timm decides
    adaptation by λ (a group with weight decay 0 is not adapted unless always_adapt), lbsgd by the
    parameter groups (decay_bn_bias=true adapts every tensor, whatever λ). Each difference shows as
    a different trajectory, and setting timm to match removes it."""
    # gradients of norm above 1 (a loss x 100), each step's clipped by its own factor
    clipped, ours = reference_trajectories(ours_lamb, timm_lamb(), RAMP_SMALL, scale=100.0)
    assert (clipped[-1] - ours[-1]).abs().max() > 1e-3
    same, ours = reference_trajectories(
        ours_lamb, timm_lamb(max_grad_norm=None), RAMP_SMALL, scale=100.0
    )
    torch.testing.assert_close(ours[-1], same[-1], rtol=1e-12, atol=1e-14)
    timm_, ours = reference_trajectories(
        ours_lamb, timm_lamb(max_grad_norm=None), RAMP_SMALL, adapt_biases=True
    )
    assert (timm_[-1] - ours[-1]).abs().max() > 1e-3  # timm leaves the λ = 0 biases unadapted
    always, ours = reference_trajectories(
        ours_lamb, timm_lamb(max_grad_norm=None, always_adapt=True), RAMP_SMALL, adapt_biases=True
    )
    for a, b in zip(always, ours, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


def test_adamw_equals_torch_adamw():
    """torch.optim.AdamW computes w·(1 − ηλ) − η·r, ours w − η·(r + λ·w): the same iterates."""
    ref, ours = reference_trajectories(
        lambda g: AdamW(g, lr=RAMP_SMALL[0], eps=1e-6),
        lambda g: torch.optim.AdamW(g, lr=RAMP_SMALL[0], eps=1e-6, foreach=False),
        RAMP_SMALL,
    )
    for a, b in zip(ref, ours, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
