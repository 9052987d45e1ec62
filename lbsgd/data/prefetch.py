"""Loader batches onto the training device, one batch ahead, finished (normalised) there.

Loader workers hand over uint8 (4x fewer bytes than float32 through shared memory and PCIe); the
float cast and normalisation are one batched operation on the device (:class:`Normalise`), and on
CUDA the next batch is copied and normalised on a side stream while the current one trains
(:func:`to_device`, as NVIDIA's apex ImageNet example and timm's ``PrefetchLoader``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch


class Normalise:
    """Per-channel ``(x / 255 - mean) / std`` of a uint8 (N, C, H, W) batch, in float32, computed
    where the batch is. ``mean``/``std``: statistics of pixels scaled to [0, 1]."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != len(self.mean):
            raise ValueError(
                f"Normalise needs uint8 (N, {len(self.mean)}, H, W) batches, got "
                f"{x.dtype} {tuple(x.shape)}"
            )
        out = x.to(torch.float32)
        # Python scalars, not device tensors: no host-to-device copy of constants per batch
        for c, (m, s) in enumerate(zip(self.mean, self.std, strict=True)):
            out[:, c].sub_(255.0 * m).mul_(1.0 / (255.0 * s))
        return out


def to_device(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device | None,
    finish: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(finish(x), y)`` of each ``(x, y)`` of ``batches``, on ``device`` (None: where they are).

    On CUDA, batch k+1's copy (from pinned memory, asynchronous) and ``finish`` are queued on a
    side stream before batch k is handed out; the consumer's stream waits for the side stream only
    when it takes the batch, and ``record_stream`` tells the caching allocator that the batch's
    memory, allocated on the side stream, is in use on the consumer's until its work there is done.
    No host synchronisation. Elsewhere (CPU) the batches are finished in turn.
    """
    if device is None or device.type != "cuda":
        for x, y in batches:
            if device is not None:
                x, y = x.to(device), y.to(device)
            yield (finish(x) if finish is not None else x), y
        return
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    ahead: tuple[torch.Tensor, torch.Tensor] | None = None
    for x, y in batches:
        with torch.cuda.stream(side):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            if finish is not None:
                x = finish(x)
        if ahead is not None:
            yield ahead  # the consumer queues its step on `main` while the copy above runs
        main.wait_stream(side)
        x.record_stream(main)
        y.record_stream(main)
        ahead = (x, y)
    if ahead is not None:
        yield ahead
