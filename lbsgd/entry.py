"""The entry of a run: :func:`train` checks what needs the machine, joins the process group and
dispatches to the synchronous loop (:class:`lbsgd.trainer.Run`) or, with ``async_ps=true``, to the
parameter server (:class:`lbsgd.parameter_server.Run`).

:func:`check` and :func:`check_memory` are the rules that need the registries, the data directory,
the process layout or the machine's memory (``experiments.sweep`` asks them before launching);
:func:`deterministic` switches on deterministic kernels.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lbsgd import data, distributed, isa, models, parameter_server, trainer
from lbsgd.config import Config, ConfigError, check_world
from lbsgd.registry import import_plugins


def check(
    cfg: Config,
    world_size: int | None = None,
    local_world_size: int | None = None,
    *,
    here: bool = True,
) -> None:
    """Rules that need the registries, the data directory or the process layout (torchrun's
    environment by default); with the config's own checks, all before any work starts. The
    config's plugins are imported first (a Config built in Python names them, as a file does).
    ``here=False``: the run goes to other machines (a Slurm job), so this one's devices and
    memory are not its to check."""
    import_plugins(cfg.plugins)
    data.check(cfg)
    if cfg.model not in models.MODELS:
        raise ConfigError(models.MODELS.unknown_message(cfg.model))
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if cfg.async_ps and world_size < 2:
        raise ConfigError(
            f"async_ps=true needs torchrun with at least 2 processes (rank 0 the server, the "
            f"others workers), not world_size={world_size}"
        )
    check_world(cfg, world_size, local_world_size)
    if here:
        distributed.check_layout(cfg.device, cfg.backend, local_world_size or world_size)
        check_memory(cfg, local_world_size or world_size)


# The keys that size a model, named when its parameters do not fit (else the model's name)
MODEL_SIZE_KEYS = {"resnet": ("depth", "width")}


def check_memory(cfg: Config, processes: int) -> None:
    """Refuse, before any work, a run whose parameters (with their gradients and momentum, fp32)
    and generated in-memory data cannot fit in this machine's memory, once per process of the
    node: building it would take hours or end in an allocation failure's traceback. A lower
    bound (activations and the data loader's copies come on top); a plugin dataset, or a model
    that cannot be built on the meta device, is not sized."""
    shape = data.shape_of(cfg)
    if shape is None:
        return
    try:
        params = models.parameter_count(cfg, *shape)
    except Exception:  # a model that is only sized when it is really built
        return
    model_bytes = 12 * params
    data_bytes, data_keys = data.memory_need(cfg)
    need = processes * (model_bytes + data_bytes)
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need <= have:
        return
    keys = MODEL_SIZE_KEYS.get(cfg.model, ("model",)) if model_bytes >= data_bytes else data_keys
    gib = 2.0**30
    raise ConfigError(
        f"{', '.join(f'{k}={getattr(cfg, k)}' for k in keys)}: the run needs at least "
        f"{need / gib:,.1f} GiB of memory ({params:,} parameters with their gradients and "
        f"momentum: {model_bytes / gib:,.1f} GiB, in-memory data: {data_bytes / gib:,.1f} GiB, "
        f"on each of {processes} process(es)) and this machine has {have / gib:,.1f} GiB "
        "(valid: a smaller model or dataset)"
    )


def train(cfg: Config) -> dict[str, Any]:
    """Train one run to the end (or until it diverges); returns its summary.json content (a
    parameter server's worker: its own)."""
    # async_ps: rank 0 a parameter server, the others asynchronous workers
    run = parameter_server.Run if cfg.async_ps else trainer.Run
    check(cfg)
    isa.require(cfg.cpu_isa)  # before the run's first CPU operation: refused if it cannot hold
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    if cfg.deterministic:
        deterministic()
    ctx = distributed.init(cfg.device, backend=cfg.backend)
    try:
        return run(cfg, ctx).run()
    finally:
        distributed.shutdown()
        # a train() called from Python (a notebook) leaves the process as it found it; asked only
        # when changed: the setter imports torch._inductor (with torch._dynamo, ~2.3 s of CPU)
        if torch.are_deterministic_algorithms_enabled() != before[0]:
            torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[1:]


def deterministic() -> None:
    """Deterministic kernels from here on (before CUDA starts): cuBLAS needs a fixed workspace
    (its documented setting for reproducibility), cuDNN no benchmarking and no nondeterministic
    algorithms; an operation with no deterministic implementation raises instead of varying."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
