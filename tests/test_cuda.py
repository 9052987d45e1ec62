"""lbsgd on a CUDA device: the CPU suite's properties where the GPU changes the code path.

fp16 loss scaling, bf16 with channels_last, NCCL, deterministic kill-and-resume, torch.compile,
ghost BN's native kernels, and processes sharing one GPU over gloo. Every test is marked ``cuda``
and skipped where torch sees no GPU (tests/conftest.py); a test that needs two GPUs says so.

Training runs are subprocesses started by the CPU suite's launchers (tests/conftest.py's ``lbsgd``,
tests/helpers.py's ``run_fault_worker``), so that a CUDA error, a compilation cache or
deterministic mode (a process-wide torch setting) stays in its own process. Comparisons of two
layouts or of compiled and eager code run with ``NVIDIA_TF32_OVERRIDE=0``: cuDNN and cuBLAS then
compute in fp32, and what is left to tolerate is the order of float additions, as on the CPU, rather
than TF32's 10-bit rounding.
"""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import LEARNING, TINY, lbsgd
from helpers import (
    KILL_AT,
    SIX_STEP_ARGS,
    assert_bitwise,
    final_weights,
    initial_weights,
    resume_args,
    run_fault_worker,
    train_steps,
)

from lbsgd import checkpoint
from lbsgd.models.ghost_bn import GhostBatchNorm

pytestmark = pytest.mark.cuda  # the training runs are also slow; ghost BN's kernel tests are not

FP32_ONLY = {"NVIDIA_TF32_OVERRIDE": "0"}  # no TF32 in cuDNN/cuBLAS: comparisons at fp32 precision


def _args(out: Path, name: str, **keys) -> list[str]:
    """``lbsgd train`` keys: the shared tiny run (tests/conftest.py) on the GPU."""
    keys = {**TINY, "device": "cuda", "out_dir": str(out), "name": name, **keys}
    return [f"{k}={v}" for k, v in keys.items()]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def _ran_on_cuda(run_dir: Path, world_size: int = 1) -> None:
    env = _summary(run_dir)["environment"]
    assert env["device"].startswith("cuda") and env["gpu"], env  # not a silent CPU fallback
    assert env["world_size"] == world_size, env


# -- mixed precision and memory format ------------------------------------------------------------


@pytest.mark.slow
def test_fp16_on_cuda_lowers_the_loss_scale_and_counts_skipped_steps(tmp_path):
    # tests/test_precision.py's CPU test on the GPU: 2^30 overflows fp16 activation gradients
    # (max 65504), so the first steps are skipped and the scale halves at each
    r = lbsgd(
        [
            "train",
            *_args(
                tmp_path,
                "fp16",
                precision="fp16",
                loss_scale=2.0**30,
                epochs=3,
                zero_init_residual=False,
            ),
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "fp16"
    _ran_on_cuda(run_dir)
    summary = _summary(run_dir)
    assert summary["status"] == "completed"
    scales = [rec["loss_scale"] for rec in _train_records(run_dir)]
    assert scales[0] < 2.0**30 and scales == sorted(scales, reverse=True)
    assert summary["skipped_steps"] == round(math.log2(2.0**30 / scales[-1]))
    assert summary["skipped_steps"] >= 1


@pytest.mark.slow
def test_bf16_channels_last_on_cuda_trains_to_a_finite_falling_loss(tmp_path):
    # tests/test_trainer.py's learning run (4,000 easy images, 375 steps of batch 32). Measured on
    # the CPU in bf16 + channels_last: mean loss of the first 75 steps 2.33-2.35, of the last 75
    # 1.08-1.35 (seeds 0, 1); top-1 error 33-50% (chance: 90%).
    r = lbsgd(
        [
            "train",
            *_args(
                tmp_path,
                "bf16",
                precision="bf16",
                channels_last=True,
                **LEARNING,
            ),
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "bf16"
    _ran_on_cuda(run_dir)
    summary = _summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 375
    losses = [rec["loss"] for rec in _train_records(run_dir)]
    assert len(losses) == 375 and all(isinstance(v, float) and math.isfinite(v) for v in losses)
    first, last = sum(losses[:75]) / 75, sum(losses[-75:]) / 75
    assert last < 0.8 * first, (first, last)
    assert summary["final"]["top1_error_pct"] < 75, summary["final"]


# -- process groups -------------------------------------------------------------------------------


@pytest.mark.slow
def test_torchrun_world_of_one_trains_over_nccl(tmp_path):
    # NCCL_DEBUG=INFO: NCCL itself reports its communicator (torch creates it at init when given
    # the device), which shows that the process group really is NCCL's
    r = lbsgd(
        ["train", *_args(tmp_path, "nccl", backend="nccl", epochs=1)],
        nproc=1,
        env={"NCCL_DEBUG": "INFO"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NCCL INFO" in r.stdout + r.stderr, (r.stdout[-2000:], r.stderr[-2000:])
    assert "world_size=1 x micro_batch=16 x accum_steps=4 = batch_size=64" in r.stdout
    run_dir = tmp_path / "runs" / "nccl"
    _ran_on_cuda(run_dir)
    summary = _summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 8  # 512 / 64 per epoch
    assert checkpoint.load(run_dir)["step"] == 8


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        "gloo",  # both processes on GPU 0 (process i on GPU i % device_count)
        pytest.param(
            "nccl",
            marks=pytest.mark.skipif(
                torch.cuda.device_count() < 2, reason="needs 2 GPUs: NCCL takes one per process"
            ),
        ),
    ],
)
def test_two_processes_on_cuda_end_with_the_weights_of_one_accumulating(tmp_path, backend):
    """tests/test_distributed.py's layout guarantee on the GPU, deterministic kernels: 2 processes x
    micro-batch 16 and 1 process accumulating 2 micro-batches of 16 end with the same weights and
    BN statistics, up to the order of float additions (10x the CPU test's tolerance)."""
    keys = [k for k in SIX_STEP_ARGS if not k.startswith(("bn_batch=", "device="))]
    keys += ["bn_batch=8", "micro_batch=16", "device=cuda", "deterministic=true"]
    two = lbsgd(
        ["train", *keys, f"backend={backend}", f"out_dir={tmp_path}", "name=two"],
        nproc=2,
        env=FP32_ONLY,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "world_size=2 x micro_batch=16 x accum_steps=1 = batch_size=32" in two.stdout
    one = lbsgd(["train", *keys, f"out_dir={tmp_path}", "name=one"], env=FP32_ONLY)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "world_size=1 x micro_batch=16 x accum_steps=2 = batch_size=32" in one.stdout
    _ran_on_cuda(tmp_path / "runs" / "two", world_size=2)
    _ran_on_cuda(tmp_path / "runs" / "one")
    got = checkpoint.load(tmp_path / "runs" / "two")
    want = checkpoint.load(tmp_path / "runs" / "one")
    assert got["step"] == want["step"] == 6
    init = initial_weights()
    moved = 0.0
    for key, value in want["model"].items():  # parameters and BN buffers alike
        torch.testing.assert_close(got["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
        if value.is_floating_point():
            moved = max(moved, (value - init[key]).abs().max().item())
    assert moved > 1e-2  # the weights did train: the equality is not that of untouched models


# -- deterministic resume -------------------------------------------------------------------------


@pytest.mark.slow
def test_deterministic_cuda_run_killed_mid_epoch_resumes_to_bitwise_equal_weights(tmp_path):
    """tests/test_resume.py's kill test on the GPU: with deterministic=true a run killed with
    SIGKILL before step 11 resumes from its step-9 checkpoint (CUDA generator state included) and
    ends bitwise where the uninterrupted run ends (fp16: the loss scaler's state matters too)."""
    keys = {"device": "cuda", "deterministic": True, "precision": "fp16", "loss_scale": 2.0**24}
    r = run_fault_worker(resume_args(tmp_path / "straight", "one", **keys))
    assert r.returncode == 0, r.stderr[-3000:]
    want = final_weights(tmp_path / "straight" / "runs" / "one")

    args = resume_args(tmp_path, "one", **keys)
    run_dir = tmp_path / "runs" / "one"
    r = run_fault_worker(args, kill_at=KILL_AT)
    assert r.returncode == -9  # SIGKILL: no handler ran, nothing was cleaned up
    assert _summary(run_dir)["status"] == "running"
    saved = checkpoint.load(run_dir)
    assert saved["step"] == 9 and saved["sampler"] == {"step": 9, "epoch": 1, "offset": 32}
    assert saved["ranks"][0]["cuda"] is not None  # the CUDA generator's state is saved
    assert saved["precision"]["scaler"]["scale"] < 2.0**24  # overflows lowered the loss scale

    r = run_fault_worker(args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from" in r.stdout and "at step 9" in r.stdout
    _ran_on_cuda(run_dir)
    assert _summary(run_dir)["status"] == "completed"
    assert_bitwise(final_weights(run_dir), want)
    assert train_steps(run_dir) == list(range(1, 17))


# -- torch.compile --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # compilation of the training and evaluation graphs: minutes
def test_compiled_model_on_cuda_trains_to_the_weights_of_eager_mode(tmp_path):
    """compile=true (ghost BN in its folded form, fused kernels) takes the same 8 steps as eager
    mode: the weights agree to 2% of how far training moved each tensor (the compiler reorders
    float additions; the difference is far below that)."""
    keys = {"epochs": 1, "eval_every": 0}  # 8 steps of 64, one evaluation at the end
    eager = lbsgd(["train", *_args(tmp_path, "eager", **keys)], env=FP32_ONLY)
    assert eager.returncode == 0, eager.stderr[-3000:]
    compiled = lbsgd(
        ["train", *_args(tmp_path, "compiled", compile=True, **keys)], env=FP32_ONLY, timeout=600
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    _ran_on_cuda(tmp_path / "runs" / "compiled")
    want = checkpoint.load(tmp_path / "runs" / "eager")["model"]
    got = checkpoint.load(tmp_path / "runs" / "compiled")["model"]
    assert got.keys() == want.keys()  # compile leaves the checkpoint's keys as they are
    init = initial_weights()  # TINY: ResNet-8 of width 8, seed 0, as test_distributed's run
    moved_any = 0.0
    for key, value in want.items():
        if not value.is_floating_point():  # num_batches_tracked
            assert torch.equal(got[key], value), key
            continue
        moved = (value - init[key]).norm().item()
        moved_any = max(moved_any, moved)
        assert (got[key] - value).norm().item() <= 0.02 * moved + 1e-6, (key, moved)
    assert moved_any > 1e-2


# -- ghost BN's kernels ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt", [torch.channels_last, torch.contiguous_format], ids=["channels_last", "contiguous"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ghost_bn_on_cuda_equals_plain_bn_applied_per_group(dtype, fmt):
    """tests/test_ghost_bn.py on the GPU: the one pass over all groups of n samples, forward and
    backward, equals F.batch_norm on each group; the memory format is kept; the group statistics
    summed for the running statistics are the groups' means and unbiased variances. bf16 is what
    BN sees under autocast: half-precision activations, fp32 parameters; its reference is the same
    bf16 values normalised in fp32."""
    n, c, g = 8, 4, 3
    torch.manual_seed(0)
    bn = GhostBatchNorm(c, group_size=n).cuda()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    x = torch.randn(g * n, c, 5, 5, device="cuda").to(dtype).contiguous(memory_format=fmt)
    upstream = torch.randn(g * n, c, 5, 5, device="cuda").to(dtype)
    xg = x.clone().requires_grad_()
    y = bn(xg)
    y.backward(upstream)

    x_ref = x.detach().float().requires_grad_()
    w = bn.weight.detach().clone().requires_grad_()
    b = bn.bias.detach().clone().requires_grad_()
    ref = torch.cat(
        [F.batch_norm(part, None, None, w, b, True, 0.0, bn.eps) for part in x_ref.split(n)]
    )
    ref.backward(upstream.float())

    assert y.dtype == dtype and xg.grad.dtype == dtype and bn.weight.grad.dtype == torch.float32
    assert y.is_contiguous(memory_format=fmt) and xg.grad.is_contiguous(memory_format=fmt)
    # fp32: kernel against kernel; bf16: the output and input gradient rounded to 8 bits
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 2e-2}
    torch.testing.assert_close(y.float(), ref.detach(), **tol)
    torch.testing.assert_close(xg.grad.float(), x_ref.grad, **tol)
    # parameter gradients against the fp32 reference: fp32 to 1e-4; bf16 within one bf16 rounding
    # (2^-8) of the magnitude summed, per channel: on an H100 torch's own bf16 BN kernels reduce
    # in half precision (contiguous: the bias gradient 0.20 from fp32's; F.batch_norm's own
    # channels_last weight gradient 1.1% off), so no tighter bound holds for every kernel
    if dtype == torch.float32:
        torch.testing.assert_close(bn.weight.grad, w.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(bn.bias.grad, b.grad, rtol=1e-4, atol=1e-4)
    else:
        dy = upstream.float()
        x_hat = (ref.detach() - b.detach()[:, None, None]) / w.detach()[:, None, None]
        for grad, want, terms in ((bn.weight.grad, w.grad, dy * x_hat), (bn.bias.grad, b.grad, dy)):
            assert ((grad - want).abs() <= 2**-8 * terms.abs().sum((0, 2, 3))).all()

    groups = x.float().reshape(g, n, c, 25).transpose(1, 2).reshape(g, c, n * 25)
    torch.testing.assert_close(bn.group_mean_sum, groups.mean(-1).sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        bn.group_var_sum, groups.var(-1, unbiased=True).sum(0), rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
def test_micro_batch_auto_probes_the_gpu_leaves_no_trace_and_is_recorded(tmp_path):
    # the tiny run's share (batch 64, bn_batch 16) fits whole: the probe picks 64; with
    # deterministic kernels the run ends bitwise where micro_batch=64 given by hand ends, so the
    # probe's forward/backward left nothing behind (BN buffers, RNG, gradients)
    keys = {"deterministic": True, "epochs": 1}
    out = {}
    for name, micro in (("auto", "auto"), ("fixed", 64)):
        r = lbsgd(["train", *_args(tmp_path, name, micro_batch=micro, **keys)], env=FP32_ONLY)
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = r.stdout
    assert "micro_batch=auto -> 64" in out["auto"]
    saved = (tmp_path / "runs" / "auto" / "config.yaml").read_text()
    assert "micro_batch: auto" in saved and "\nmicro_batch: 64" in saved  # the key, then derived
    auto, fixed = (checkpoint.load(tmp_path / "runs" / n)["model"] for n in ("auto", "fixed"))
    for k in fixed:
        assert torch.equal(auto[k], fixed[k]), k


# -- gradient noise scale ---------------------------------------------------------------------


@pytest.mark.slow
def test_noise_scale_on_cuda_changes_no_weight_and_matches_the_cpu_measurement(tmp_path):
    """Deterministic mode, fp32 without TF32: a CUDA run measuring the noise scale ends with the
    weights of the same run without it (the probe only reads gradients), and its first step's
    norms (same initial weights and batch) equal the CPU's up to the order of float additions."""
    keys = {"micro_batch": 16, "deterministic": True, "epochs": 1}
    probe = {"noise_scale": True, "noise_scale_batch": 32}  # refused without noise_scale=true
    for name, extra in (("on", probe), ("off", {})):
        r = lbsgd(["train", *_args(tmp_path, name, **keys, **extra)], env=FP32_ONLY)
        assert r.returncode == 0, r.stderr[-3000:]
        _ran_on_cuda(tmp_path / "runs" / name)
    r = lbsgd(
        [
            "train",
            *_args(
                tmp_path,
                "cpu",
                **{**keys, **probe, "device": "cpu", "deterministic": False},
            ),
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    on, off = (checkpoint.load(tmp_path / "runs" / n)["model"] for n in ("on", "off"))
    assert_bitwise(on, off)
    gpu, cpu = (_train_records(tmp_path / "runs" / n)[0] for n in ("on", "cpu"))
    assert (gpu["gns_b_small"], gpu["gns_b_big"]) == (32, 64)
    for key in ("gns_g_small_sq", "gns_g_big_sq"):
        assert gpu[key] == pytest.approx(cpu[key], rel=1e-3), key


# -- the optimizers' foreach paths on the device -------------------------------------------------


@pytest.mark.parametrize("kind", ["lars", "lamb", "adamw"])
def test_optimizer_steps_on_cuda_equal_the_cpu_steps(kind):
    """LARS's and LAMB's trust ratios stay on the device (no host sync); the iterates on the GPU
    are the CPU's to float64 rounding (five steps of a decayed and an undecayed group)."""
    from lbsgd.optim import LAMB, LARS, AdamW

    make = {
        "lars": lambda g: LARS(g, lr=2.0, momentum=0.9, trust_coefficient=0.001),
        "lamb": lambda g: LAMB(g, lr=0.05),
        "adamw": lambda g: AdamW(g, lr=0.01),
    }[kind]
    gen = torch.Generator().manual_seed(0)
    start = [
        torch.randn(8, 4, generator=gen, dtype=torch.float64),
        torch.zeros(8, dtype=torch.float64),
    ]
    grads = [[torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in start] for _ in range(5)]
    ends = []
    for device in ("cpu", "cuda"):
        params = [torch.nn.Parameter(p.clone().to(device)) for p in start]
        opt = make(
            [
                {"params": params[:1], "weight_decay": 0.01},
                {"params": params[1:], "weight_decay": 0.0, "adapt": False},
            ]
        )
        for g in grads:
            for p, gi in zip(params, g, strict=True):
                p.grad = gi.to(device)
            opt.step()
        ends.append([p.detach().cpu() for p in params])
    for cpu, cuda, first in zip(*ends, start, strict=True):
        torch.testing.assert_close(cuda, cpu, rtol=1e-12, atol=1e-12)
        assert (cpu - first).abs().max() > 1e-4  # every tensor moved
