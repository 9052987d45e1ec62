"""Evaluation on the test split: the sums a process computes, the record they make, the summary.

Shared by the synchronous loop (lbsgd.trainer: each process a shard, the sums added over the
processes) and the parameter server (lbsgd.parameter_server: the server alone, the whole split).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lbsgd import data
from lbsgd.config import Config
from lbsgd.network import memory_format
from lbsgd.precision import Precision


@torch.no_grad()
def evaluation_sums(
    net: torch.nn.Module,
    splits: data.Splits,
    idx: torch.Tensor,
    batch: int,
    cfg: Config,
    device: torch.device,
    precision: Precision,
) -> torch.Tensor:
    """[summed loss, top-1 hits, top-5 hits, count] (float64, on ``device``) of ``net`` in eval
    mode over the test samples ``idx``, in batches of ``batch``; the net is left in train mode."""
    net.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    k = min(5, splits.num_classes)
    fmt = memory_format(cfg)
    for x, y in data.batches(splits.test, idx.split(batch), cfg.workers, device=device):
        x, y = x.to(device, memory_format=fmt), y.to(device)
        with precision.autocast():
            out = net(x).float()
        topk = out.topk(k, dim=1).indices
        sums[0] += torch.nn.functional.cross_entropy(out, y, reduction="sum")
        sums[1] += (topk[:, 0] == y).sum()
        sums[2] += (topk == y[:, None]).any(dim=1).sum()
        sums[3] += len(y)
    net.train()
    return sums


def evaluation_record(step: int, epoch: float, sums: torch.Tensor) -> dict[str, Any]:
    """The metrics.jsonl record of an evaluation after ``step`` steps (``epoch`` epochs) from
    :func:`evaluation_sums` (summed over the processes that shared the test split)."""
    loss, top1, top5, count = sums.cpu().tolist()
    return {
        "kind": "eval",
        "step": step,
        "epoch": epoch,
        "top1_error_pct": 100.0 * (1 - top1 / count),
        "top5_error_pct": 100.0 * (1 - top5 / count),
        "test_loss": loss / count,
    }


def note_evaluation(summary: dict[str, Any], rec: dict[str, Any]) -> None:
    """An evaluation into summary.json's ``final``, and ``best`` when its top-1 error is lower."""
    summary.setdefault("final", {}).update(
        {k: rec[k] for k in ("top1_error_pct", "top5_error_pct", "test_loss")}
    )
    if rec["top1_error_pct"] < summary.get("best", {}).get("top1_error_pct", math.inf):
        summary["best"] = {"top1_error_pct": rec["top1_error_pct"], "step": rec["step"]}
