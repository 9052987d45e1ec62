"""``python -m lbsgd`` that prints, on stdout, how many gloo threads its process has just before and
just after :func:`lbsgd.distributed.shutdown`, for tests/test_distributed.py.

Threads are read from Linux's ``/proc/self/task``, by the names torch gives them (``gloo_tcp_loop``,
``pt_gloo_runloop``). Nothing else changes: the trainer and torchrun are the real ones.
"""

import os
import sys
from pathlib import Path

from lbsgd import cli, distributed


def gloo_threads() -> int:
    tasks = Path("/proc/self/task").iterdir()
    return sum("gloo" in (t / "comm").read_text() for t in tasks)


_shutdown = distributed.shutdown


def _counted_shutdown() -> None:
    rank = os.environ.get("RANK", "0")
    print(f"rank {rank}: gloo threads before shutdown: {gloo_threads()}", flush=True)
    _shutdown()
    print(f"rank {rank}: gloo threads after shutdown: {gloo_threads()}", flush=True)


distributed.shutdown = _counted_shutdown

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
