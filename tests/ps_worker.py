"""``python -m lbsgd`` for tests/test_parameter_server.py: a slowed worker, a record of the last update.

Environment:
- ``LBSGD_TEST_PS_SLOW_RANK=r`` and ``LBSGD_TEST_PS_SLOW_S=t``: worker rank r sleeps t seconds
  before computing each gradient, holding weights that the other workers' updates make stale.
- ``LBSGD_TEST_PS_LAST_UPDATE=path``: the server saves there, around its last update, the model's
  state before and after it, the message it applied (loss, BN group sums, gradient) and its lr.

Nothing else changes: the parameter server, its messages and torchrun are the real ones.
"""

import os
import sys
import time

import torch

from lbsgd import cli, parameter_server

SLOW_RANK = int(os.environ.get("LBSGD_TEST_PS_SLOW_RANK", "-1"))
SLOW_S = float(os.environ.get("LBSGD_TEST_PS_SLOW_S", "0"))
LAST_UPDATE = os.environ.get("LBSGD_TEST_PS_LAST_UPDATE")

_gradient = parameter_server.Run.gradient
_apply = parameter_server.Run.apply


def _slow_gradient(self, model, task):
    if self.ctx.rank == SLOW_RANK:
        time.sleep(SLOW_S)
    return _gradient(self, model, task)


def _apply_and_record_last(self, step, payload):
    if LAST_UPDATE is None or step != self.d.total_steps - 1:
        return _apply(self, step, payload)
    before = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
    lr = _apply(self, step, payload)
    after = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
    torch.save(
        {
            "before": before,
            "after": after,
            "payload": payload.clone(),
            "lr": lr,
            "n_sums": self.n_sums,
            "params": [k for k, _ in self.net.named_parameters()],
        },
        LAST_UPDATE,
    )
    return lr


parameter_server.Run.gradient = _slow_gradient
parameter_server.Run.apply = _apply_and_record_last

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
