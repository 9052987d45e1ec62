"""``python -m lbsgd`` with one injected fault, for tests/test_resume.py.

Environment:
- ``LBSGD_TEST_KILL_AT_STEP=s`` and ``LBSGD_TEST_KILL_RANK=r``: rank r kills itself with SIGKILL when
  it is about to run optimizer step s (0-based: after s steps), on torchrun's first attempt only
  (``TORCHELASTIC_RESTART_COUNT`` 0 or unset), so that a restarted group runs to the end.

Nothing else changes: the trainer, its checkpoints and torchrun are the real ones.
"""

import os
import signal
import sys

from lbsgd import cli, trainer

KILL_AT = int(os.environ.get("LBSGD_TEST_KILL_AT_STEP", "-1"))
KILL_RANK = int(os.environ.get("LBSGD_TEST_KILL_RANK", "0"))

if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    _learning_rate = trainer.learning_rate

    def _learning_rate_or_die(step, cfg, d):
        if step == KILL_AT and int(os.environ.get("RANK", "0")) == KILL_RANK:
            os.kill(os.getpid(), signal.SIGKILL)
        return _learning_rate(step, cfg, d)

    trainer.learning_rate = _learning_rate_or_die

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
