"""Which samples each process sees at each optimizer step (Goyal et al. 2017 §3).

The epochs' permutations are laid end to end into one stream of indices, and step s consumes the
kn consecutive indices ``stream[s·kn : (s+1)·kn]``: every batch is full and every sample is used
once per epoch (``steps_per_epoch = N / kn`` may be fractional). The global batch is cut into
micro-batches of m consecutive indices and rank r of W takes the r-th contiguous 1/W of them, so
the set of micro-batches depends only on kn and m, never on W. Epoch e's permutation depends only
on (seed, e): every rank computes the stream without communicating, and a restart at step s
continues exactly."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lbsgd import seeding


def permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seeding.epoch_order(seed, epoch))
    return torch.randperm(num_samples, generator=g)


@dataclass(kw_only=True, eq=False)
class StepSampler:
    """Yields this rank's micro-batches (index tensors) for optimizer steps [start_step, total_steps).

    Each step contributes ``accum_steps = batch_size / (world_size · micro_batch)`` micro-batches in
    a row; usable directly, or as a DataLoader ``batch_sampler``.
    """

    num_samples: int
    batch_size: int
    micro_batch: int
    rank: int
    world_size: int
    seed: int
    total_steps: int
    start_step: int = 0

    def __post_init__(self) -> None:
        per_step = self.world_size * self.micro_batch
        if self.batch_size % per_step:
            raise ValueError(
                f"batch_size={self.batch_size} is not a multiple of world_size * micro_batch = "
                f"{per_step}"
            )
        self.accum_steps = self.batch_size // per_step
        self._perms: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return (self.total_steps - self.start_step) * self.accum_steps

    def epoch_of(self, step: int) -> float:
        """Epochs completed after ``step`` optimizer steps (fractional)."""
        return step * self.batch_size / self.num_samples

    def global_batch(self, step: int) -> torch.Tensor:
        """The kn indices of optimizer step ``step``, over all ranks."""
        pos, need, parts = step * self.batch_size, self.batch_size, []
        while need:
            epoch, offset = divmod(pos, self.num_samples)
            take = min(self.num_samples - offset, need)
            parts.append(self._perm(epoch)[offset : offset + take])
            pos, need = pos + take, need - take
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _perm(self, epoch: int) -> torch.Tensor:
        # A batch spans at most a few epochs; keep the two newest permutations.
        if epoch not in self._perms:
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = permutation(self.num_samples, self.seed, epoch)
        return self._perms[epoch]

    def position(self, step: int) -> dict[str, int]:
        """Where the stream stands before optimizer step ``step``: epoch and offset within it."""
        epoch, offset = divmod(step * self.batch_size, self.num_samples)
        return {"step": step, "epoch": epoch, "offset": offset}

    def rank_positions(self, step: int) -> list[torch.Tensor]:
        """Stream positions (sample counts since the run began) of this rank's micro-batches of
        ``step``: a sample's position names it uniquely over the whole run, on any layout."""
        share = self.batch_size // self.world_size
        start = step * self.batch_size + self.rank * share
        return list(torch.arange(start, start + share).split(self.micro_batch))

    def rank_batches(self, step: int) -> list[torch.Tensor]:
        """This rank's micro-batches of step ``step``, in the order they are run."""
        share = self.batch_size // self.world_size
        mine = self.global_batch(step)[self.rank * share : (self.rank + 1) * share]
        return list(mine.split(self.micro_batch))

    def __iter__(self) -> Iterator[torch.Tensor]:
        for step in range(self.start_step, self.total_steps):
            yield from self.rank_batches(step)
