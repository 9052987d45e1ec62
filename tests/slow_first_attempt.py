"""A plugin (``plugins=[tests/slow_first_attempt.py]``) that makes each optimizer step of a Slurm
job's first attempt sleep ``SLOW_STEP_S`` seconds (an environment variable; unset: no sleep): a
tiny run outlasts a real time limit without a long run's CPU time, and its requeued attempt
(``SLURM_RESTART_COUNT`` set) goes at full speed. The mathematics is untouched."""

import os
import time

from torch.optim.optimizer import register_optimizer_step_pre_hook

PAUSE_S = float(os.environ.get("SLOW_STEP_S", "0"))
if PAUSE_S and int(os.environ.get("SLURM_RESTART_COUNT", "0")) == 0:
    register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: time.sleep(PAUSE_S))
