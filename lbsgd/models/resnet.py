"""ResNets: the CIFAR ResNet of He et al. 2016 §4.2 and torchvision's ImageNet ResNets.

``zero_init_residual`` follows Goyal et al. 2017 §5.3: the γ of the last BN in each residual
branch starts at 0, so every block starts as identity (+ ReLU) and the network behaves as a
shallower one early in training; Goyal et al. report it helps most at large minibatch sizes.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from lbsgd.models import register_model

# He et al. 2016 §4.2 report these depths; any 6n+2 with n >= 1 is accepted.
_PAPER_DEPTHS = "8, 14, 20, 32, 44, 56, 110, …"


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    # No bias: every conv is followed by BN, whose β plays that role.
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3×3 convs with BN; identity shortcut, or 1×1 conv + BN when the shape changes.

    The projection shortcut is He et al.'s option B (§3.3). Children are registered in forward
    order (conv1, bn1, conv2, bn2, shortcut) like torchvision's blocks, so ``bn2`` is the last BN
    of the residual branch and the shortcut's BN lives inside ``shortcut``.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, out_ch, stride)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = _conv3x3(out_ch, out_ch)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )

    def residual(self, x: Tensor) -> Tensor:
        """The residual branch F(x) alone (zero at init under zero_init_residual)."""
        out = self.relu(self.bn1(self.conv1(x)))
        return self.bn2(self.conv2(out))

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.residual(x) + self.shortcut(x))


class CifarResNet(nn.Module):
    """He et al. 2016 §4.2: 3×3 stem, three stages of n blocks at widths w, 2w, 4w, GAP, FC.

    Stages 2 and 3 start with stride 2, so the feature maps go s → s/2 → s/4; with the global
    average pool any input of at least 8×8 works (16×16 synthetic, 32×32 CIFAR).
    """

    def __init__(self, blocks_per_stage: int, width: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(_conv3x3(3, width), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        stages: list[nn.Module] = []
        in_ch = width
        for i, out_ch in enumerate((width, 2 * width, 4 * width)):
            blocks: list[nn.Module] = []
            for j in range(blocks_per_stage):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(BasicBlock(in_ch, out_ch, stride))
                in_ch = out_ch
            stages.append(nn.Sequential(*blocks))
        self.stage1, self.stage2, self.stage3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stage3(self.stage2(self.stage1(self.stem(x))))
        return self.fc(self.pool(x).flatten(1))


def _init_weights(model: CifarResNet, zero_init_residual: bool) -> None:
    # He et al. 2015 ("Delving deep") init for ReLU nets, as in He et al. 2016 and torchvision;
    # fan_out preserves the magnitude of the backward pass.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if zero_init_residual:
        # Goyal et al. §5.3: γ=0 on the last BN of each residual branch only; the projection
        # shortcut's BN keeps γ=1, otherwise a downsampling block would output zeros.
        for m in model.modules():
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)


def resnet_cifar(
    depth: int, width: int = 16, num_classes: int = 10, zero_init_residual: bool = False
) -> CifarResNet:
    """The CIFAR ResNet of depth 6n+2 (ResNet-20: depth=20, width=16, ≈0.27M parameters)."""
    if depth < 8 or (depth - 2) % 6 != 0:
        raise ValueError(f"depth={depth} is not 6n+2 for model=resnet (valid: {_PAPER_DEPTHS})")
    if width < 1:
        raise ValueError(f"width={width} must be a positive integer for model=resnet")
    model = CifarResNet((depth - 2) // 6, width, num_classes)
    _init_weights(model, zero_init_residual)
    return model


@register_model("resnet")
def build_resnet(cfg: Any, num_classes: int, image_size: int) -> nn.Module:
    # image_size is not needed: the global average pool adapts to any input >= 8×8.
    return resnet_cifar(cfg.depth, cfg.width, num_classes, cfg.zero_init_residual)


# torchvision's ImageNet ResNets (He et al. 2016 §3.4); Goyal et al. train ResNet-50. torchvision
# implements zero_init_residual the same way: γ=0 on bn3 of Bottleneck / bn2 of BasicBlock, the
# last BN of the residual branch (checked in tests/test_models.py).
# torchvision is imported when one is built: importing it costs 1-2 s of CPU, which a process
# that builds none (a notebook's kernel, lbsgd report) need not pay.
_TORCHVISION_RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


def _torchvision_builder(name: str) -> Any:
    def build(cfg: Any, num_classes: int, image_size: int) -> nn.Module:
        import torchvision

        factory = getattr(torchvision.models, name)
        # weights=None: never download; the studies train from scratch.
        return factory(
            weights=None, num_classes=num_classes, zero_init_residual=cfg.zero_init_residual
        )

    build.__name__ = build.__qualname__ = f"build_{name}"
    return build


for _name in _TORCHVISION_RESNETS:
    register_model(_name)(_torchvision_builder(_name))
