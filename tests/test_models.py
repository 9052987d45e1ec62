"""lbsgd.models: parameter counts, shapes, zero-init of residual blocks, registry, gradients."""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

import pytest
import torch
import torchvision
from torch import nn
from torchvision.models.resnet import BasicBlock as TvBasicBlock
from torchvision.models.resnet import Bottleneck as TvBottleneck

from lbsgd import config
from lbsgd.models import MODELS, build, parameter_count, register_model
from lbsgd.models.alexnet import IMAGENET_LAYOUT, AlexNet
from lbsgd.models.resnet import BasicBlock, resnet_cifar


def cfg(
    model: str,
    depth: int = 20,
    width: int = 16,
    zero_init_residual: bool = False,
    pool5_bn: bool = False,
):
    return SimpleNamespace(
        model=model,
        depth=depth,
        width=width,
        zero_init_residual=zero_init_residual,
        pool5_bn=pool5_bn,
    )


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build_meta(name: str, num_classes: int, image_size: int) -> nn.Module:
    # Meta tensors: shapes without storage or init cost, so 60M-parameter nets count instantly.
    with torch.device("meta"):
        return build(cfg(name), num_classes, image_size)


# --- parameter counts, each against a figure derived independently of the model code --------


def conv(c_in: int, c_out: int, k: int, bias: bool = True) -> int:
    return c_in * c_out * k * k + (c_out if bias else 0)


def linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def cifar_resnet_params(depth: int, w: int, num_classes: int) -> int:
    """He et al. §4.2 with option-B projections: bias-free convs, BN (γ, β) after each conv."""
    n = (depth - 2) // 6
    bn = 2  # γ and β per channel
    total = conv(3, w, 3, bias=False) + bn * w  # stem
    c_in = w
    for c in (w, 2 * w, 4 * w):
        for _ in range(n):
            total += conv(c_in, c, 3, bias=False) + conv(c, c, 3, bias=False) + 2 * bn * c
            if c_in != c:  # projection shortcut: 1×1 conv + BN
                total += conv(c_in, c, 1, bias=False) + bn * c
            c_in = c
    return total + linear(4 * w, num_classes)


def alexnet_params(convs, kernels, pooled: int, fc: int, num_classes: int) -> int:
    total, c_in = 0, 3
    for c, k in zip(convs, kernels, strict=True):
        total += conv(c_in, c, k)
        c_in = c
    return total + linear(c_in * pooled * pooled, fc) + linear(fc, fc) + linear(fc, num_classes)


@pytest.mark.parametrize(("depth", "width", "classes"), [(20, 16, 10), (8, 4, 3), (56, 16, 100)])
def test_cifar_resnet_parameter_count_matches_architecture_formula(depth, width, classes):
    expected = cifar_resnet_params(depth, width, classes)
    if (depth, width, classes) == (20, 16, 10):
        assert expected == 272_474  # "0.27M" in He et al. Table 6 (option A: 269,722)
    assert n_params(build(cfg("resnet", depth, width), classes, 32)) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [  # torchvision's published counts at 1000 classes
        ("resnet18", 11_689_512),
        ("resnet34", 21_797_672),
        ("resnet50", 25_557_032),
        ("resnet101", 44_549_160),
        ("resnet152", 60_192_808),
        ("alexnet", 61_100_840),
    ],
)
def test_imagenet_models_parameter_counts_match_torchvision_golden(name, expected):
    assert n_params(build_meta(name, 1000, 224)) == expected


def test_imagenet_alexnet_formula_and_is_torchvision_architecture():
    expected = alexnet_params((64, 192, 384, 256, 256), (11, 5, 3, 3, 3), 6, 4096, 1000)
    assert expected == 61_100_840
    with torch.device("meta"):
        ours, theirs = AlexNet(1000, IMAGENET_LAYOUT), torchvision.models.alexnet(num_classes=1000)
    # Same modules with the same hyper-parameters, and interchangeable state_dicts.
    assert repr(ours) == repr(theirs)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in theirs.state_dict().items()
    }


@pytest.mark.parametrize("image_size", [16, 32])
def test_small_alexnet_parameter_count_matches_formula(image_size):
    # Widths (64, 192, 384, 256, 256)/4, kernels 5,5,3,3,3, pool to 2×2, FC 4096/4.
    expected = alexnet_params((16, 48, 96, 64, 64), (5, 5, 3, 3, 3), 2, 1024, 10)
    assert expected == 1_477_338
    model = build(cfg("alexnet"), 10, image_size)
    assert n_params(model) == expected
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # no BN in plain AlexNet
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 5
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 3
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 3
    assert sum(isinstance(m, nn.Dropout) for m in model.modules()) == 2


@pytest.mark.parametrize("image_size", [16, 32])
def test_small_alexnet_pool5_is_eighth_of_input_so_avgpool_never_upsamples(image_size):
    # Three stride-2 pools: 16 -> 2 and 32 -> 4, both at least the 2×2 the classifier expects.
    with torch.no_grad():
        feats = AlexNet(10).features(torch.randn(1, 3, image_size, image_size))
    assert feats.shape == (1, 64, image_size // 8, image_size // 8)


# --- output shapes --------------------------------------------------------------------------


@pytest.mark.parametrize("image_size", [16, 32, 224])
@pytest.mark.parametrize("name", ["resnet", "alexnet", "resnet18"])
def test_output_shape_at_16_32_and_imagenet_pixels(name, image_size):
    model = build(cfg(name, depth=8, width=8), 7, image_size).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, image_size, image_size)).shape == (2, 7)


# --- zero_init_residual (Goyal et al. §5.3) ---------------------------------------------------


@cache  # ResNet-50 takes ~0.5 s to build; these tests only read the models (eval, no_grad)
def resnet_for(name: str, zero_init: bool) -> nn.Module:
    torch.manual_seed(0)
    return build(cfg(name, depth=8, width=8, zero_init_residual=zero_init), 10, 16).eval()


def residual_blocks(model: nn.Module) -> list[nn.Module]:
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock | TvBasicBlock | TvBottleneck)]
    assert blocks
    return blocks


def branch_bns(block: nn.Module) -> list[nn.BatchNorm2d]:
    # BNs that are direct children belong to the residual branch; the projection shortcut's BN
    # is nested inside `shortcut` / `downsample`.
    return [m for m in block.children() if isinstance(m, nn.BatchNorm2d)]


def shortcut(block: nn.Module) -> nn.Module:
    if isinstance(block, BasicBlock):
        return block.shortcut
    return block.downsample if block.downsample is not None else nn.Identity()


@pytest.mark.parametrize("name", ["resnet", "resnet50"])
def test_zero_init_residual_zeroes_exactly_the_last_branch_bn(name):
    model = resnet_for(name, zero_init=True)
    last = {id(branch_bns(b)[-1]) for b in residual_blocks(model)}
    n_zero = 0
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            if id(m) in last:
                assert torch.all(m.weight == 0)
                n_zero += 1
            else:  # stem, inner branch BNs and projection-shortcut BNs
                assert torch.all(m.weight == 1)
    assert n_zero == len(residual_blocks(model))


@pytest.mark.parametrize("name", ["resnet", "resnet50"])
def test_zero_init_residual_blocks_are_identity_plus_relu(name):
    model = resnet_for(name, zero_init=True)
    blocks = residual_blocks(model)
    inputs, branch_out = {}, {}

    def save_input(block, args):
        inputs[block] = args[0].clone()

    def save_branch(bn, args, out):
        branch_out[bn] = out.clone()  # clone: the block adds the shortcut in place afterwards

    handles = [b.register_forward_pre_hook(save_input) for b in blocks]
    handles += [branch_bns(b)[-1].register_forward_hook(save_branch) for b in blocks]
    with torch.no_grad():
        model(torch.randn(2, 3, 16, 16))
    for h in handles:
        h.remove()
    with torch.no_grad():
        for b in blocks:
            assert torch.all(branch_out[branch_bns(b)[-1]] == 0)  # the residual branch F(x)
            x = inputs[b]
            torch.testing.assert_close(b(x), torch.relu(shortcut(b)(x)))


@pytest.mark.parametrize("name", ["resnet", "resnet50"])
def test_without_zero_init_residual_no_bn_gamma_is_zero(name):
    model = resnet_for(name, zero_init=False)
    gammas = [m.weight for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert gammas and all(torch.all(g == 1) for g in gammas)


# --- depth validation -----------------------------------------------------------------------


@pytest.mark.parametrize("depth", [21, 2, 0])
def test_invalid_depth_error_names_depth_and_model(depth):
    msg = f"depth={depth} is not 6n+2 for model=resnet (valid: 8, 14, 20, 32, 44, 56, 110, …)"
    with pytest.raises(ValueError) as err:
        build(cfg("resnet", depth=depth), 10, 16)
    assert str(err.value) == msg
    with pytest.raises(ValueError, match=f"depth={depth} "):
        resnet_cifar(depth)


# --- registry -------------------------------------------------------------------------------


def test_registered_user_model_is_built_by_build():
    name = "test_models_tiny_mlp"
    seen = {}

    def tiny(c, num_classes: int, image_size: int) -> nn.Module:
        seen.update(cfg=c, num_classes=num_classes, image_size=image_size)
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, num_classes))

    register_model(name)(tiny)
    try:
        c = cfg(name)
        model = build(c, 4, 8)
        assert model(torch.randn(2, 3, 8, 8)).shape == (2, 4)
        assert seen == {"cfg": c, "num_classes": 4, "image_size": 8}
    finally:
        MODELS._builders.pop(name)  # keep the global registry as other tests expect it


def test_registering_a_taken_name_raises():
    with pytest.raises(ValueError, match="'resnet' is already registered"):
        register_model("resnet")(lambda c, n, s: nn.Identity())


def test_unknown_model_raises_keyerror_with_suggestion():
    with pytest.raises(KeyError, match="did you mean 'resnet'"):
        build(cfg("resnt"), 10, 16)


def test_builtin_models_are_registered():
    expected = {
        "resnet",
        "resnet18",
        "resnet34",
        "resnet50",
        "resnet101",
        "resnet152",
        "alexnet",
        "alexnet_bn",
    }
    assert set(MODELS.names()) >= expected


# --- every parameter learns -----------------------------------------------------------------


@pytest.mark.parametrize(
    "model_cfg",
    [cfg("resnet", depth=8, width=4), cfg("alexnet"), cfg("alexnet_bn", pool5_bn=True)],
    ids=["resnet8", "alexnet", "alexnet_bn"],
)
def test_one_sgd_step_changes_every_parameter(model_cfg):
    torch.manual_seed(0)
    model = build(model_cfg, 10, 16).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.functional.cross_entropy(model(torch.randn(8, 3, 16, 16)), torch.arange(8))
    loss.backward()
    opt.step()
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged


# --- the AlexNet family of the LARS and Jia studies -------------------------------------------


@pytest.mark.parametrize("image_size", [16, 224])
@pytest.mark.parametrize(
    ("name", "pool5_bn"),
    [("alexnet", False), ("alexnet", True), ("alexnet_bn", False), ("alexnet_bn", True)],
)
def test_alexnet_family_places_bn_after_each_conv_and_after_pool5(name, pool5_bn, image_size):
    model = build(cfg(name, pool5_bn=pool5_bn), 10, image_size)
    layers = list(model.features)
    convs = [i for i, m in enumerate(layers) if isinstance(m, nn.Conv2d)]
    bns = [i for i, m in enumerate(layers) if isinstance(m, nn.BatchNorm2d)]
    after_conv = [i for i in bns if i - 1 in convs]
    assert len(convs) == 5
    assert len(after_conv) == (5 if name == "alexnet_bn" else 0)  # You et al.: BN after each conv
    pool5 = [i for i in bns if isinstance(layers[i - 1], nn.MaxPool2d)]
    assert len(pool5) == int(pool5_bn) and (not pool5_bn or pool5[0] == len(layers) - 1)
    assert len(bns) == len(after_conv) + len(pool5)
    # BN's β makes a conv's bias redundant: the convs BN follows have none
    assert all((layers[i].bias is None) == (i + 1 in bns) for i in convs)
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, image_size, image_size)).shape == (1, 10)


@pytest.mark.parametrize("image_size, pooled", [(16, False), (32, True)])
def test_alexnet_skips_its_adaptive_pool_where_it_is_the_identity(image_size, pooled):
    # the identity pool would still run a backward with no deterministic CUDA kernel
    model = build(SimpleNamespace(model="alexnet", pool5_bn=False), 10, image_size)
    calls = []
    model.avgpool.register_forward_hook(lambda *a: calls.append(1))
    out = model(torch.randn(2, 3, image_size, image_size))
    assert out.shape == (2, 10) and bool(calls) == pooled


@pytest.mark.parametrize(("depth", "width"), [(8, 8), (20, 16), (110, 16), (1202, 4), (6002, 2)])
def test_parameter_count_without_building_matches_the_formula_at_any_depth(depth, width):
    """models.parameter_count sizes a model before any run (lbsgd.entry.check_memory): on the meta
    device, and for the CIFAR ResNet from two shallow builds, linear in the blocks per stage."""
    c = config.from_dict({"model": "resnet", "depth": depth, "width": width})
    assert parameter_count(c, 10, 32) == cifar_resnet_params(depth, width, 10)


def test_parameter_count_of_imagenet_models_is_torchvision_s():
    assert parameter_count(config.from_dict({"model": "resnet50"}), 1000, 224) == 25_557_032
