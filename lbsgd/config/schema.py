"""The schema: every key, its kind, type, default and help (:class:`Keys`), and the run's identity.

*Experiment* keys define a run's mathematics exactly as a paper states it and identify the run,
whatever the hardware; *hardware* keys only say how it executes; *run* keys say where results go and
how the run is tracked (``lbsgd keys`` prints them all). Defaults are Goyal et al. 2017 §5.1 and
§5.3, except the model and data: a CIFAR-style ResNet-20 on the generated ``synthetic`` set, so
that ``lbsgd train`` runs anywhere without a download. The keys here are unchecked: a
:class:`lbsgd.config.load.Config` is them checked when made (:mod:`lbsgd.config.checks`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lbsgd.config import optimizers

# the optimizer key's values: the names of the optimizers' table
OptimizerName = Literal[optimizers.NAMES]  # type: ignore[valid-type]


def _key(default: Any, kind: str, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"kind": kind, "help": help})


def _exp(default: Any, help: str) -> Any:
    return _key(default, "experiment", help)


def _hw(default: Any, help: str) -> Any:
    return _key(default, "hardware", help)


def _run(default: Any, help: str) -> Any:
    return _key(default, "run", help)


@dataclasses.dataclass(frozen=True)
class Keys:
    # --- experiment keys: model and data -------------------------------------------------------
    model: str = _exp(
        "resnet", "network: resnet (CIFAR-style, depth 6n+2), resnet18..152, alexnet, alexnet_bn"
    )
    depth: int = _exp(20, "depth of model=resnet: 6n+2 (8, 14, 20, 32, 44, 56, 110)")
    width: int = _exp(16, "channels of the first stage of model=resnet (16 in He et al. 2016)")
    zero_init_residual: bool = _exp(
        True, "gamma=0 for the last BN of each residual block (Goyal §5.3)"
    )
    pool5_bn: bool = _exp(False, "BN after pool5 of model=alexnet/alexnet_bn (Jia et al. 2018)")
    dataset: str = _exp(
        "synthetic",
        "synthetic (generated, no download), cifar10, imagenet, fashion_mnist; fake (random "
        "images of fake_image_size, nothing to learn: throughput measurements, lbsgd bench train)",
    )
    data_dir: str | None = _exp(
        None,
        "folder holding cifar10/imagenet/fashion_mnist (fashion_mnist's null: "
        "/usr/share/datasets/fashion-mnist if it exists, else data/fashion_mnist); "
        "cache folder for synthetic",
    )
    synthetic_train: int = _exp(32_000, "images in the synthetic train split")
    synthetic_test: int = _exp(5_000, "images in the synthetic test split")
    synthetic_difficulty: Literal["easy", "standard"] = _exp(
        "standard",
        "synthetic generator setting: standard (noise 0.12, clutter) or easy (smoke tests)",
    )
    synthetic_noise: float | None = _exp(
        None, "pixel noise sigma of synthetic; null = difficulty's"
    )
    fake_train: int = _exp(
        2_560,
        "images in the fake train split (2,560 at 224x224: 1.5 GB of float32, held on the GPU)",
    )
    fake_test: int = _exp(256, "images in the fake test split")
    fake_image_size: int = _exp(224, "height = width of the fake images (ImageNet: 224)")
    fake_classes: int = _exp(1_000, "classes of the fake labels (ImageNet: 1000)")
    fashion_size: int = _exp(
        28,
        "height = width of dataset=fashion_mnist's images, 4 to 28: 28 as they are, smaller "
        "area-averaged once when the dataset is built (14: each pixel the mean of a 2x2 block)",
    )
    fashion_train: int = _exp(
        60_000,
        "training images of dataset=fashion_mnist, a multiple of 10 up to 60000: the first "
        "fashion_train/10 of each class in file order (the test split stays 10,000)",
    )
    holdout: int = _exp(
        0,
        "training images held out as a validation split, carved deterministically from the "
        "train split (the same images whatever seed, batch and layout); the run trains on the "
        "rest and also evaluates the held-out images at every evaluation; 0 = none",
    )
    stop_at_error: float | None = _exp(
        None,
        "end the run at the first evaluation (eval_every, eval_per_octave) whose held-out top-1 "
        "error (holdout's split; the test split's without one) is at or below this (%), with a "
        "full evaluation and a checkpoint there: the steps to a target error without the steps "
        "after it (Shallue et al. 2018); null: every step",
    )
    seed: int = _exp(
        0, "seeds the initialisation, the data order and fake's images (same across batch sizes)"
    )
    # --- experiment keys: minibatch and learning rate ------------------------------------------
    batch_size: int = _exp(256, "global minibatch kn: samples per optimizer step over all workers")
    bn_batch: int = _exp(32, "n: samples per BatchNorm group (Goyal: 32 per worker)")
    base_lr: float = _exp(0.1, "eta: learning rate at reference_batch")
    reference_batch: int = _exp(256, "batch at which base_lr is stated (Goyal: 256)")
    lr_scaling: Literal["linear", "sqrt", "none"] = _exp(
        "linear", "peak lr = base_lr * f(batch_size / reference_batch): linear, sqrt or none"
    )
    warmup: Literal["none", "constant", "gradual"] = _exp(
        "gradual", "none; constant (warmup_lr, then the peak); gradual (linear per iteration)"
    )
    warmup_epochs: float = _exp(5.0, "length of the warmup in epochs (Goyal: 5)")
    warmup_lr: float | None = _exp(None, "lr at the start of the warmup; null = base_lr (Goyal)")
    schedule: Literal["step", "poly", "cosine"] = _exp(
        "step", "decay after warmup, evaluated every iteration: step, poly or cosine"
    )
    milestones: tuple[float, ...] = _exp((30.0, 60.0, 80.0), "epochs where schedule=step decays")
    decay_factor: float = _exp(0.1, "lr multiplier at each milestone of schedule=step")
    poly_power: float = _exp(2.0, "power of schedule=poly (2 for LARS, You et al. 2017)")
    epochs: float = _exp(90.0, "training length in epochs (passes over the train split)")
    # --- experiment keys: optimizer ------------------------------------------------------------
    optimizer: OptimizerName = _exp("sgd", optimizers.help_text())
    momentum: float = _exp(0.9, "momentum m of the velocity update (sgd, lars)")
    nesterov: bool = _exp(True, "Nesterov momentum (Goyal §5.1; sgd, lars)")
    weight_decay: float = _exp(
        1e-4, "weight decay lambda: L2 for sgd (beta of LARS), inside the step for lamb and adamw"
    )
    momentum_correction: bool = _exp(
        True, "scale the velocity by lr_{t+1}/lr_t when the lr changes (Goyal §3, eq. 10)"
    )
    lars_eta: float = _exp(0.001, "LARS trust coefficient eta (You et al. 2017: 0.001)")
    adam_beta1: float = _exp(0.9, "beta1 of lamb and adamw: decay of the first moment, in [0, 1)")
    adam_beta2: float = _exp(
        0.999, "beta2 of lamb and adamw: decay of the second moment, in [0, 1)"
    )
    adam_eps: float = _exp(
        1e-6, "epsilon of lamb and adamw, added to the root of the second moment (You et al. 2019)"
    )
    decay_bn_bias: bool = _exp(
        False,
        "weight decay also on biases and BN gamma/beta (false: Jia); with lars and lamb it also "
        "decides their trust ratio unless adapt_bn_bias says otherwise",
    )
    adapt_bn_bias: bool | None = _exp(
        None,
        "biases and BN gamma/beta take part in the trust ratio of lars and lamb; null: as "
        "decay_bn_bias (decayed ones are adapted, the no-decay group steps at the raw global lr)",
    )
    grad_clip: float | None = _exp(
        None,
        "clip each step's gradient to this global L2 norm before the optimizer steps (the loss "
        "gradient, all-reduced and unscaled, before weight decay: torch.nn.utils."
        "clip_grad_norm_, as timm's --clip-grad); its norm before clipping is logged per step "
        "as grad_norm; null: no clipping",
    )
    # --- experiment keys: numerics -----------------------------------------------------------
    precision: Literal["fp32", "fp16", "bf16"] = _exp(
        "fp32", "fp32; fp16 (autocast, fp32 master weights, dynamic loss scaling); bf16 (autocast)"
    )
    loss_scale: float = _exp(65536.0, "initial dynamic loss scale of precision=fp16 (2^16)")
    # --- experiment keys: communication that changes the mathematics --------------------------
    local_sgd: int = _exp(
        0,
        "post-local SGD: from switch_step (null: the end of the warmup), average parameters every "
        "this many steps; 0 = off",
    )
    switch_step: int | None = _exp(
        None,
        "optimizer step where local_sgd's local steps (and BMUF's blocks) and comm_hook=powersgd's "
        "compression (from step 2 at the earliest) take over from the all-reduce; null = "
        "warmup_steps, the end of the warmup; needs local_sgd > 0 or comm_hook=powersgd",
    )
    # --- experiment keys: BMUF, block momentum on local_sgd's blocks (lbsgd.comm.BMUF) ----------
    block_momentum: float = _exp(
        0.0,
        "eta_B of BMUF (Chen & Huo 2016): the block update is eta_B * previous + block_lr * "
        "(averaged model - block start), every local_sgd steps; in [0, 1); needs local_sgd > 0",
    )
    block_lr: float = _exp(
        1.0, "epsilon_B of BMUF: block learning rate (> 0); 1 with block_momentum 0 = local_sgd"
    )
    block_nesterov: bool = _exp(
        True, "BMUF: each block starts from W + eta_B * Delta (Nesterov, NBM); false: from W (CBM)"
    )
    # --- experiment keys: simulated asynchronous SGD, bounded staleness (lbsgd.staleness) -------
    staleness: int = _exp(
        0,
        "tau_max: the update of step t applies gradients computed on the weights of step t - tau "
        "(Lian et al. 2015); 0 = synchronous. Keeps tau_max + 1 copies of the parameters (also "
        "in the checkpoint)",
    )
    staleness_dist: Literal["fixed", "uniform"] = _exp(
        "fixed",
        "fixed: tau = staleness for every step (layout-independent); uniform: tau drawn from "
        "{0..staleness} per micro-batch and step, seeded by (seed, step, micro-batch): the draws "
        "follow micro_batch",
    )
    # --- experiment keys: asynchronous parameter server (lbsgd.parameter_server) ----------------
    async_ps: bool = _exp(
        False,
        "asynchronous SGD under torchrun (>= 2 processes): rank 0 a parameter server applying each "
        "worker's gradient on arrival, ranks 1.. workers without barriers; one update = one "
        "worker's batch_size samples; measured staleness in summary.json; cannot resume",
    )
    # --- hardware keys --------------------------------------------------------------------------
    micro_batch: int | Literal["auto"] | None = _hw(
        None,
        "samples per process per forward/backward; null = bn_batch; auto = the largest multiple "
        "of bn_batch dividing the per-process share that fits the device (probed; docs/gpu.md)",
    )
    workers: int = _hw(
        0,
        "DataLoader worker processes for imagenet and other per-sample datasets "
        "(0: in the main process; in-memory ones, cifar10 included, use none)",
    )
    bucket_cap_mb: float = _hw(25.0, "DDP gradient bucket size in MB (tensor fusion)")
    comm_hook: Literal["none", "fp16", "bf16", "powersgd", "hierarchical", "parameter_server"] = (
        _hw(
            "none",
            "gradient all-reduce: none (DDP's), fp16/bf16 compressed, powersgd, hierarchical "
            "(intra-node, then across nodes), parameter_server (reduce to rank 0, broadcast)",
        )
    )
    powersgd_rank: int = _hw(1, "rank of PowerSGD's low-rank factors (comm_hook=powersgd)")
    channels_last: bool = _hw(False, "channels_last memory format for model and inputs")
    compile: bool = _hw(False, "torch.compile the model")
    device: Literal["auto", "cpu", "cuda"] = _hw("auto", "auto: cuda when available, else cpu")
    backend: Literal["auto", "nccl", "gloo"] = _hw(
        "auto",
        "process group: auto (nccl on cuda, gloo on cpu); gloo on cuda lets processes share a GPU",
    )
    deterministic: bool = _hw(
        False,
        "deterministic algorithms (torch.use_deterministic_algorithms, cuBLAS workspace): bitwise "
        "repeatable GPU runs, slower; CPU runs are deterministic either way",
    )
    threads: int = _hw(0, "torch intra-op threads per process (at most 1024); 0 = torch's default")
    cpu_isa: Literal["native", "portable", "avx2", "avx512_core", "avx512_core_amx"] = _hw(
        "native",
        "cap of the CPU kernels (ATen, oneDNN, MKL), set before torch loads: native (none); "
        "portable (AVX2, oneDNN off, MKL COMPATIBLE: the same digits on Intel and AMD CPUs with "
        "AVX2); avx2, avx512_core, avx512_core_amx (same digits on CPUs of one vendor) (lbsgd.isa)",
    )
    # --- run keys -------------------------------------------------------------------------------
    out_dir: str = _run(
        "results/cli",
        "results root; the run lives in out_dir/study/name (a study's runs: results/<profile>; "
        "git ignores the default, results/cli)",
    )
    study: str = _run("runs", "group of runs (a notebook's study); W&B group")
    name: str | None = _run(
        None, "run name; null = model-dataset-batch-warmup-seed-<experiment hash>"
    )
    profile: str | None = _run(
        None,
        "study scale that produced the run (smoke, cpu, cifar10, imagenet); W&B config and tags",
    )
    varied: tuple[str, ...] = _run(
        (), "the keys this run's study varies; the W&B display name and tags show their values"
    )
    resume: bool = _run(False, "continue the run in out_dir/study/name from its last checkpoint")
    eval_every: int = _run(1, "evaluate every this many epochs (0: only at the end)")
    eval_per_octave: int = _run(
        0,
        "also evaluate the held-out split (holdout; else the test split) at the steps "
        "ceil(2^(j/eval_per_octave)): this many per doubling of the step count, for the steps "
        "to a target error (0: none)",
    )
    log_every: int = _run(10, "optimizer steps between metric flushes (one collective per flush)")
    checkpoint: bool = _run(
        True,
        "write checkpoint.pt (previous one kept as checkpoint.prev.pt) every epoch and at the end",
    )
    checkpoint_every: int = _run(
        0, "also write checkpoint.pt every this many optimizer steps (0: epochs and end only)"
    )
    wandb: Literal["auto", "online", "offline", "disabled"] = _run(
        "auto", "W&B mode; auto: online with an API key, else offline"
    )
    wandb_project: str = _run("lbsgd", "W&B project")
    plugins: tuple[str, ...] = _run((), "modules or .py files imported first (register_model, …)")
    noise_scale: bool = _run(
        False,
        "measure the gradient noise scale B_simple = tr(Sigma)/|G|^2 every step from two batch "
        "sizes, noise_scale_batch and batch_size (McCandlish et al. 2018; lbsgd.noise_scale)",
    )
    noise_scale_batch: int | None = _run(
        None,
        "B_small of noise_scale: samples per small batch, consecutive micro-batches of one "
        "process; null = micro_batch (then it follows the layout: set it to compare layouts)",
    )
    noise_scale_ema: float = _run(
        0.99, "decay of the moving averages of |G|^2 and tr(Sigma) whose ratio is B_simple"
    )

    # -- identity and (de)serialisation --------------------------------------------------------

    def keys_of(self, kind: str) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.metadata["kind"] == kind
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON-ready values (tuples become lists)."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    def experiment_id(self) -> str:
        """Short hash of the experiment keys: equal for runs of the same mathematics.

        Keys of :data:`HASHED_ONLY_OFF_DEFAULT` count only when they differ from their default."""
        keys = {
            k: v
            for k, v in self.keys_of("experiment").items()
            if k not in HASHED_ONLY_OFF_DEFAULT or v != FIELDS[k].default
        }
        text = json.dumps(plain(keys), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:8]

    def run_name(self) -> str:
        if self.name:
            return self.name
        arch = f"{self.model}{self.depth}" if self.model == "resnet" else self.model
        return f"{arch}-{self.dataset}-b{self.batch_size}-{self.warmup}-s{self.seed}-{self.experiment_id()}"

    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.study / self.run_name()


def plain(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Keys))
FIELDS = {f.name: f for f in dataclasses.fields(Keys)}
# Experiment keys added after results were committed: a run's name ends in the hash of its
# experiment keys, so a new key in the hash would rename every earlier run (and make committed
# results look missing). These keys enter the hash only when they differ from their default, which
# is what every earlier run had. Append each new experiment key here; never remove one.
HASHED_ONLY_OFF_DEFAULT: tuple[str, ...] = (
    "fake_train",
    "fake_test",
    "fake_image_size",
    "fake_classes",
)
HASHED_ONLY_OFF_DEFAULT += ("staleness", "staleness_dist")  # lbsgd.staleness
HASHED_ONLY_OFF_DEFAULT += ("async_ps",)  # lbsgd.parameter_server
HASHED_ONLY_OFF_DEFAULT += ("block_momentum", "block_lr", "block_nesterov")  # lbsgd.comm.BMUF
HASHED_ONLY_OFF_DEFAULT += ("fashion_size", "fashion_train")  # lbsgd.data.fashion_mnist
HASHED_ONLY_OFF_DEFAULT += ("switch_step",)  # lbsgd.comm: PowerSGD, local SGD and BMUF
HASHED_ONLY_OFF_DEFAULT += ("adam_beta1", "adam_beta2", "adam_eps")  # lbsgd.optim: LAMB, AdamW
HASHED_ONLY_OFF_DEFAULT += ("holdout",)  # lbsgd.data.hold_out: the validation split
HASHED_ONLY_OFF_DEFAULT += ("adapt_bn_bias",)  # lbsgd.optim.param_groups
HASHED_ONLY_OFF_DEFAULT += ("stop_at_error",)  # lbsgd.trainer: a run ended at its target
HASHED_ONLY_OFF_DEFAULT += ("grad_clip",)  # lbsgd.features.GradClip


@functools.cache
def hints() -> dict[str, Any]:
    return typing.get_type_hints(Keys)


def unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; `lbsgd keys` lists the vocabulary"


def describe_keys() -> str:
    """The vocabulary as a table: key, kind, type, default, help."""
    rows = []
    for f in dataclasses.fields(Keys):
        tp = hints()[f.name]
        tname = getattr(tp, "__name__", None) if not typing.get_args(tp) else None
        tname = tname or str(tp).replace("typing.", "").replace("NoneType", "None")
        rows.append((f.name, f.metadata["kind"], tname, repr(f.default), f.metadata["help"]))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:<{w[3]}}  {r[4]}" for r in rows
    )
