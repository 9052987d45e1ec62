"""Compact images augmented in batches where the model trains (CIFAR-10's pad-crop-flip).

A split is one uint8 NCHW tensor held on the training GPU when it fits; a batch is an index into
it, and augmentation, float conversion and normalisation are a few batched tensor operations there
instead of per-sample transforms in a DataLoader (docs/times.md has what that bought). Each
sample's placement is a pure function of its stream-position seed (:func:`placements`), so a sample
gets the same crop and flip whatever the layout or restarts, computed without a host read."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

# He et al. 2016 §4.2 (CIFAR-10): "4 pixels are padded on each side, and a 32x32 crop is randomly
# sampled from the padded image or its horizontal flip".
PAD = 4

# Disjoint bit fields of a 63-bit seed (SplitMix64 output, every bit equally mixed): 30 bits for
# each offset, one for the flip. An offset is floor(field * span / 2^30): with 2^30 field values over
# span <= 9 offsets, the bins differ in size by one value in ~10^8, far below any measurable bias.
_FIELD = 30
_FIELD_MASK = (1 << _FIELD) - 1
_FLIP_BIT = 2 * _FIELD


def placements(seeds: torch.Tensor, span: int = 2 * PAD + 1) -> tuple[torch.Tensor, ...]:
    """(top, left, flip) of each int64 seed in [0, 2^63): offsets in [0, span), flip in {0, 1};
    int64 tensors on the seeds' device, no host read."""
    top = ((seeds & _FIELD_MASK) * span) >> _FIELD
    left = (((seeds >> _FIELD) & _FIELD_MASK) * span) >> _FIELD
    flip = (seeds >> _FLIP_BIT) & 1
    return top, left, flip


def pad_crop_flip(
    x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor, pad: int = PAD
) -> torch.Tensor:
    """Batched pad-crop-flip of NCHW ``x`` (any dtype): sample b is zero-padded by ``pad`` pixels,
    cropped to its original size at (top[b], left[b]) of the padded image, and mirrored left-right
    where flip[b] is 1. One gather over the padded batch; the output is contiguous NCHW."""
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))  # zeros, as torchvision's RandomCrop
    wp = w + 2 * pad
    j = torch.arange(w, device=x.device)
    cols = left[:, None] + torch.where(flip[:, None].bool(), w - 1 - j, j)  # (n, w)
    rows = top[:, None] + torch.arange(h, device=x.device)  # (n, h)
    flat = (rows[:, :, None] * wp + cols[:, None, :]).view(n, 1, h * w).expand(n, c, h * w)
    return padded.view(n, c, -1).gather(2, flat).view(n, c, h, w)


class DeviceImages(Dataset):
    """uint8 images (N, C, H, W) and int64 labels, with the normalisation and augmentation that
    :meth:`batch` applies on the training device.

    ``mean``/``std``: per-channel statistics of pixels scaled to [0, 1]. ``augment``: pad-crop-flip
    training batches (the test split has none). ``classes``: the class names, by label.
    ``channels``: the channels of a batch, when it differs from the images' (Fashion-MNIST's one
    grayscale channel leaves as 3 equal channels for the RGB models; None: as held).
    ``pad``: the augmentation's zero padding in pixels, the crop's offsets ranging over
    ``2 * pad + 1`` places per axis (:data:`PAD`, CIFAR-10's, by default).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        augment: bool,
        classes: list[str] | None = None,
        channels: int | None = None,
        pad: int = PAD,
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4 or len(labels) != len(images):
            raise ValueError(
                f"DeviceImages needs uint8 NCHW images and one label each, got {images.dtype} "
                f"{tuple(images.shape)} and {len(labels)} labels"
            )
        if channels is not None and images.shape[1] not in (1, channels):
            raise ValueError(
                f"channels={channels} repeats one-channel images; these have {images.shape[1]}"
            )
        self.images, self.labels = images, labels
        self.mean, self.std = tuple(mean), tuple(std)
        self.augment = augment
        self.classes = classes or []
        self.channels = channels
        self.pad = pad
        # x/255 then (x - mean)/std folded into one multiply and one subtract per pixel
        std_t = torch.tensor(std, dtype=torch.float32, device=images.device).view(-1, 1, 1)
        mean_t = torch.tensor(mean, dtype=torch.float32, device=images.device).view(-1, 1, 1)
        self._scale = 1.0 / (255.0 * std_t)
        self._shift = mean_t / std_t

    def __len__(self) -> int:
        return len(self.images)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.images, self.labels))

    @property
    def device(self) -> torch.device:
        return self.images.device

    def _like(self, images: torch.Tensor, labels: torch.Tensor, augment: bool) -> DeviceImages:
        """``images`` and ``labels`` normalised (and repeated to ``channels``) as this split's are,
        augmented when ``augment``."""
        return DeviceImages(
            images, labels, self.mean, self.std, augment, self.classes, self.channels, self.pad
        )

    def to(self, device: torch.device) -> DeviceImages:
        """This split with its tensors on ``device`` (copied once)."""
        return self._like(self.images.to(device), self.labels.to(device), self.augment)

    def subset(self, idx: torch.Tensor) -> DeviceImages:
        """The samples ``idx`` of this split (copied, in that order), augmented as it is."""
        idx = idx.to(self.device)
        return self._like(self.images[idx], self.labels[idx], self.augment)

    def for_evaluation(self) -> DeviceImages:
        """The same images (not copied) as an evaluation sees them: normalised, never augmented,
        as the test split is."""
        return self._like(self.images, self.labels, False)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """One sample as the map-style dataset contract has it (float CHW, int label), augmented
        from torch's generator like a torchvision transform; training batches use :meth:`batch`."""
        x, y = self.batch(torch.tensor([index]))
        return x[0], int(y[0])

    def batch(
        self,
        idx: torch.Tensor,
        seeds: torch.Tensor | None = None,
        device: torch.device | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 NCHW images, int64 labels) of the samples ``idx``, on ``device`` (default: where
        the split lives): augmented (when this split augments) with each sample's placement drawn
        from its seed in ``seeds`` (:func:`placements`; None: seeds drawn from torch's generator),
        then normalised, then repeated to ``channels``. No host read: index and seed tensors
        follow the data asynchronously."""
        device = self.device if device is None else torch.device(device)
        idx = torch.as_tensor(idx).to(self.device, non_blocking=True)
        x, y = self.images[idx], self.labels[idx]
        if x.device != device:  # a split left on the host (too big for the GPU): copy uint8 only
            if device.type == "cuda":
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if self.augment:
            if seeds is None:
                seeds = torch.randint(0, 2**63 - 1, (len(idx),), dtype=torch.int64)
            top, left, flip = placements(seeds.to(device, non_blocking=True), 2 * self.pad + 1)
            x = pad_crop_flip(x, top, left, flip, self.pad)
        scale = self._scale.to(device, non_blocking=True)
        shift = self._shift.to(device, non_blocking=True)
        x = x.to(torch.float32).mul_(scale).sub_(shift)
        if self.channels is not None and self.channels != x.shape[1]:
            x = x.expand(-1, self.channels, -1, -1).contiguous()  # the work done on one channel
        return x, y
