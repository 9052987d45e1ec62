"""``python -m lbsgd`` with gradient clipping written the plain way, for tests/test_grad_clip.py.

With ``LBSGD_TEST_PLAIN_CLIP=c``, every optimizer ``lbsgd.optim.build`` makes calls
``torch.nn.utils.clip_grad_norm_(model.parameters(), c)`` first thing in its ``step()``: after
the gradients are all-reduced and after ``GradScaler.unscale_`` (GradScaler.step unscales, then
calls the optimizer's step unless the gradients overflowed), before the update: PyTorch's AMP
recipe (unscale_, clip_grad_norm_, step). The run itself leaves ``grad_clip`` unset.

Nothing else changes: the trainer, DDP and torchrun are the real ones.
"""

import os
import sys

import torch

from lbsgd import cli, optim

CLIP = float(os.environ.get("LBSGD_TEST_PLAIN_CLIP", "0"))

if CLIP:
    _build = optim.build

    def _build_clipping(cfg, model):
        opt = _build(cfg, model)
        params, step = list(model.parameters()), opt.step

        def step_after_clipping(*args, **kwargs):
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            return step(*args, **kwargs)

        opt.step = step_after_clipping
        return opt

    optim.build = _build_clipping

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
