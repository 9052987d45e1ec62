"""AlexNet (Krizhevsky et al. 2012), the communication-bound case of the large-batch studies.

Its ~61M parameters, 96% of them in the three FC layers, make the all-reduce the bottleneck (You
et al. 2017 and Jia et al. 2018 scale it to 8K-64K batches). One class builds two sizes:
``IMAGENET_LAYOUT`` is torchvision's AlexNet module for module; ``SMALL_LAYOUT`` (image_size < 64)
keeps the structure at 1/4 of the widths with stride-1 convs, still FC-heavy (90% of 1.48M
parameters) yet trainable on a CPU. ``conv_bn`` gives You et al.'s AlexNet-BN, ``pool5_bn`` Jia et
al.'s BN after pool5."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from lbsgd.models import register_model


@dataclass(frozen=True)
class ConvSpec:
    out_channels: int
    kernel: int
    stride: int
    padding: int
    pool_after: bool  # a max-pool follows this conv (after conv1, conv2, conv5 in AlexNet)


@dataclass(frozen=True)
class AlexNetLayout:
    convs: tuple[ConvSpec, ...]
    pool_padding: int  # of the max-pools, overlapping: kernel 3 stride 2 (Krizhevsky et al. §3.4)
    pooled_size: int  # AdaptiveAvgPool2d output side, fixes the first FC's input size
    fc_width: int


# torchvision's AlexNet (the "one weird trick" variant: 64/192/384/256/256 channels, no LRN).
IMAGENET_LAYOUT = AlexNetLayout(
    convs=(
        ConvSpec(64, kernel=11, stride=4, padding=2, pool_after=True),
        ConvSpec(192, kernel=5, stride=1, padding=2, pool_after=True),
        ConvSpec(384, kernel=3, stride=1, padding=1, pool_after=False),
        ConvSpec(256, kernel=3, stride=1, padding=1, pool_after=False),
        ConvSpec(256, kernel=3, stride=1, padding=1, pool_after=True),
    ),
    pool_padding=0,
    pooled_size=6,
    fc_width=4096,
)

# Small inputs: widths (64, 192, 384, 256, 256)/4, FC 4096/4; 5×5 then 3×3 kernels at stride 1
# (an 11×11/4 stem would leave nothing of a 16×16 image). Pools pad by 1 so each one maps
# s -> ceil(s/2): 16 -> 8 -> 4 -> 2 and 32 -> 16 -> 8 -> 4, then the average pool to 2×2.
SMALL_LAYOUT = AlexNetLayout(
    convs=(
        ConvSpec(16, kernel=5, stride=1, padding=2, pool_after=True),
        ConvSpec(48, kernel=5, stride=1, padding=2, pool_after=True),
        ConvSpec(96, kernel=3, stride=1, padding=1, pool_after=False),
        ConvSpec(64, kernel=3, stride=1, padding=1, pool_after=False),
        ConvSpec(64, kernel=3, stride=1, padding=1, pool_after=True),
    ),
    pool_padding=1,
    pooled_size=2,
    fc_width=1024,
)

# Below this the ImageNet stem (11×11 stride 4 then three pools) collapses the feature map.
MIN_IMAGENET_SIZE = 64


class AlexNet(nn.Module):
    """AlexNet from a layout; with default flags and ``IMAGENET_LAYOUT`` it is torchvision's.

    Args:
        num_classes: outputs of the last FC layer.
        layout: channel widths, kernels, pools and FC width.
        conv_bn: BatchNorm2d after every conv, before its ReLU (convs then drop their bias,
            which BN's β makes redundant).
        pool5_bn: BatchNorm2d on the pool5 output, before the classifier.
        dropout: drop probability before FC1 and FC2 (0.5 in Krizhevsky et al. §4.2).
    """

    def __init__(
        self,
        num_classes: int,
        layout: AlexNetLayout = SMALL_LAYOUT,
        *,
        conv_bn: bool = False,
        pool5_bn: bool = False,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for spec in layout.convs:
            layers.append(
                nn.Conv2d(
                    in_ch,
                    spec.out_channels,
                    kernel_size=spec.kernel,
                    stride=spec.stride,
                    padding=spec.padding,
                    bias=not conv_bn,
                )
            )
            if conv_bn:
                layers.append(nn.BatchNorm2d(spec.out_channels))
            layers.append(nn.ReLU(inplace=True))
            if spec.pool_after:
                layers.append(nn.MaxPool2d(3, 2, layout.pool_padding))
            in_ch = spec.out_channels
        if pool5_bn:
            layers.append(nn.BatchNorm2d(in_ch))
        self.features = nn.Sequential(*layers)
        # Adaptive pool, as in torchvision, so the classifier's input size does not depend on
        # the image size (16×16 and 32×32 share one SMALL_LAYOUT model).
        self.avgpool = nn.AdaptiveAvgPool2d((layout.pooled_size, layout.pooled_size))
        fc = layout.fc_width
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(in_ch * layout.pooled_size**2, fc),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(fc, fc),
            nn.ReLU(inplace=True),
            nn.Linear(fc, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        if x.shape[-2:] != self.avgpool.output_size:  # at the design size the pool is the
            x = self.avgpool(x)  # identity; skipped, it costs no (non-deterministic CUDA) backward
        return self.classifier(x.flatten(1))


def layout_for(image_size: int) -> AlexNetLayout:
    """The ImageNet layout from 64×64 up, the small one below."""
    return IMAGENET_LAYOUT if image_size >= MIN_IMAGENET_SIZE else SMALL_LAYOUT


@register_model("alexnet")
def build_alexnet(cfg: Any, num_classes: int, image_size: int) -> nn.Module:
    # PyTorch's default layer init, as torchvision's AlexNet (no residual blocks, so no
    # zero_init_residual). pool5_bn: Jia et al. 2018's BN after pool5.
    return AlexNet(num_classes, layout_for(image_size), pool5_bn=getattr(cfg, "pool5_bn", False))


@register_model("alexnet_bn")
def build_alexnet_bn(cfg: Any, num_classes: int, image_size: int) -> nn.Module:
    # You et al. 2017's AlexNet-BN: BN after every convolution (Table 1b, Table 3).
    return AlexNet(
        num_classes, layout_for(image_size), conv_bn=True, pool5_bn=getattr(cfg, "pool5_bn", False)
    )
