"""How lbsgd starts processes: a free port, and torchrun's command line.

torchrun is ``python -m torch.distributed.run`` of the interpreter that runs lbsgd, whatever
``torchrun`` is first on the PATH. Its agents meet by a ``c10d`` rendezvous (the default: torchrun
assigns node ranks and restarts the group on a failure) or statically (``node_rank`` given: several
agents on one machine, the layout the communication benchmarks need)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port that nothing listens on now (the OS picks it; free again once this returns)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun(
    nproc_per_node: int,
    *,
    nnodes: int = 1,
    endpoint: str | None = None,
    node_rank: int | None = None,
    max_restarts: int | None = None,
    options: Sequence[str] = (),
) -> list[str]:
    """torchrun's command line up to the program it starts (append ``-m lbsgd train …``, a script,
    or ``--no-python`` and a command).

    ``endpoint`` is the rendezvous ``host:port`` (default: this machine, a free port); with
    ``node_rank`` the rendezvous is static (``--master-addr``/``--master-port`` from the endpoint),
    else c10d. ``options`` go after the launcher's own (``--tee=2``, ``--log-dir=…``)."""
    endpoint = endpoint or f"{HOST}:{free_port()}"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
    ]
    if max_restarts is not None:
        cmd.append(f"--max-restarts={max_restarts}")
    if node_rank is None:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"]
    else:
        host, _, port = endpoint.rpartition(":")
        cmd += [f"--node-rank={node_rank}", f"--master-addr={host}", f"--master-port={port}"]
    return [*cmd, *options]
