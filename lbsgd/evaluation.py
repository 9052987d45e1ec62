"""Evaluation on the test split, and on the held-out validation split when the run has one
(``holdout``): the sums a process computes, the record they make, the summary.

Shared by the synchronous loop (lbsgd.trainer: each process a shard of each split, the sums added
over the processes) and the parameter server (lbsgd.parameter_server: the server alone, the whole
splits).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import Dataset

from lbsgd import data
from lbsgd.config import Config
from lbsgd.network import memory_format
from lbsgd.precision import Precision

# The metrics of each evaluated split, as metrics.jsonl's eval records and summary.json's "final"
# name them: the test split's (named before there was another) and the held-out split's, the
# same with "val_" in front ("val_loss" for "test_loss").
METRICS = {
    "test": ("top1_error_pct", "top5_error_pct", "test_loss"),
    "val": ("val_top1_error_pct", "val_top5_error_pct", "val_loss"),
}


def evaluated(splits: data.Splits, only: str | None = None) -> dict[str, Dataset]:
    """The splits an evaluation measures, by name (:data:`METRICS`), test first: the test split,
    and the held-out one when the run has it; ``only`` ("test" or "val"): that split alone."""
    named = {"test": splits.test, **({"val": splits.val} if splits.val is not None else {})}
    return named if only is None else {only: named[only]}


@torch.no_grad()
def evaluation_sums(
    net: torch.nn.Module,
    splits: data.Splits,
    batch: int,
    cfg: Config,
    device: torch.device,
    precision: Precision,
    rank: int = 0,
    world_size: int = 1,
    only: str | None = None,
) -> torch.Tensor:
    """One row per evaluated split (:func:`evaluated`, in its order; ``only``: that split alone)
    of [summed loss, top-1 hits, top-5 hits, count] (float64, on ``device``) of ``net`` in eval
    mode over this process's shard of each (:func:`lbsgd.data.shard` of ``rank`` among
    ``world_size``; 0 of 1: the whole split), in batches of ``batch``; the net is left in train
    mode."""
    net.eval()
    rows, k, fmt = [], min(5, splits.num_classes), memory_format(cfg)
    for split in evaluated(splits, only).values():
        shard = data.shard(len(split), rank, world_size)  # type: ignore[arg-type]
        idx = torch.tensor(shard, dtype=torch.long)
        sums = torch.zeros(4, dtype=torch.float64, device=device)
        for x, y in data.batches(split, idx.split(batch), cfg.workers, device=device):
            x, y = x.to(device, memory_format=fmt), y.to(device)
            with precision.autocast():
                out = net(x).float()
            topk = out.topk(k, dim=1).indices
            sums[0] += torch.nn.functional.cross_entropy(out, y, reduction="sum")
            sums[1] += (topk[:, 0] == y).sum()
            sums[2] += (topk == y[:, None]).any(dim=1).sum()
            sums[3] += len(y)
        rows.append(sums)
    net.train()
    return torch.stack(rows)


def evaluation_record(
    step: int, epoch: float, sums: torch.Tensor, only: str | None = None
) -> dict[str, Any]:
    """The metrics.jsonl record of an evaluation after ``step`` steps (``epoch`` epochs) from
    :func:`evaluation_sums` (summed over the processes that shared the splits; ``only``: the
    split it measured alone): each split's metrics under its names (:data:`METRICS`)."""
    rec: dict[str, Any] = {"kind": "eval", "step": step, "epoch": epoch}
    rows = sums.cpu().tolist()
    names = list(METRICS.values()) if only is None else [METRICS[only]]
    for (top1_key, top5_key, loss_key), (loss, top1, top5, count) in zip(names, rows, strict=False):
        rec[top1_key] = 100.0 * (1 - top1 / count)
        rec[top5_key] = 100.0 * (1 - top5 / count)
        rec[loss_key] = loss / count
    return rec


def target_reached(target: float | None, rec: dict[str, Any]) -> bool:
    """Whether an evaluation's record meets ``stop_at_error``'s ``target``: its held-out top-1
    error (the held-out split's, else the test split's) at or below it; never when None."""
    error = rec.get("val_top1_error_pct", rec.get("top1_error_pct"))
    return target is not None and error is not None and error <= target


def note_evaluation(summary: dict[str, Any], rec: dict[str, Any]) -> None:
    """An evaluation into summary.json's ``final``, and into ``best`` where its top-1 error is
    lower than the best before: the test split's (``top1_error_pct``, ``step``) and, apart, the
    held-out split's (``val_top1_error_pct``, ``val_step``)."""
    summary.setdefault("final", {}).update(
        {k: rec[k] for names in METRICS.values() for k in names if k in rec}
    )
    best = dict(summary.get("best", {}))
    for top1, step in (("top1_error_pct", "step"), ("val_top1_error_pct", "val_step")):
        if top1 in rec and rec[top1] < best.get(top1, math.inf):
            best.update({top1: rec[top1], step: rec["step"]})
    if best:
        summary["best"] = best
