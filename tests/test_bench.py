"""``lbsgd bench train`` on any device: the fake dataset, device-resident data, the matrix mode."""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import as_args, tiny_keys, tiny_subset
from torch.utils.data import TensorDataset

from lbsgd import cli, data, isa
from lbsgd.bench import noise
from lbsgd.bench import train as bench
from lbsgd.config import Config, ConfigError, derive, from_dict
from lbsgd.data import fake

# TINY's network (ResNet-8 of width 8) on a tiny fake set: 16x16 images of 10 classes (a few ms
# per step).
TINY_FAKE = as_args(
    tiny_subset(
        ["model", "depth", "width"],
        dataset="fake",
        fake_image_size=16,
        fake_classes=10,
        fake_train=256,
        fake_test=64,
        device="cpu",
    )
)


def test_fake_dataset_has_the_asked_shape_and_classes_and_comes_from_the_seed():
    cfg = Config(dataset="fake", fake_train=40, fake_test=12, fake_image_size=20, fake_classes=7)
    splits = data.build(cfg, torch.device("cpu"))
    (x, y), (xt, yt) = splits.train.tensors, splits.test.tensors
    assert x.shape == (40, 3, 20, 20) and xt.shape == (12, 3, 20, 20)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert (splits.num_classes, splits.image_size) == (7, 20)
    assert set(y.tolist()) | set(yt.tolist()) <= set(range(7)) and len(set(y.tolist())) > 1
    assert abs(float(x.mean())) < 0.05 and float(x.std()) == pytest.approx(1.0, abs=0.05)
    # drawn afresh (not the process cache): the same seed gives the same images, another seed not
    again = fake.splits.__wrapped__(40, 12, 20, 7, cfg.seed)
    assert torch.equal(again[0], x) and torch.equal(again[1], y) and torch.equal(again[2], xt)
    other = fake.splits.__wrapped__(40, 12, 20, 7, cfg.seed + 1)
    assert not torch.equal(other[0], x)
    # each split is its own draw: the train images do not depend on the test split's size
    assert torch.equal(fake.splits.__wrapped__(40, 3, 20, 7, cfg.seed)[0], x)


def test_fake_defaults_are_imagenet_shaped():
    cfg = Config(dataset="fake")
    assert (cfg.fake_image_size, cfg.fake_classes) == (224, 1000)
    assert cfg.fake_train * 3 * 224 * 224 * 4 < 2e9  # the default train split stays under 2 GB


def test_resident_moves_in_memory_splits_once_and_leaves_the_host_case_alone():
    train = TensorDataset(torch.randn(10, 3, 4, 4), torch.arange(10))
    other = torch.utils.data.Subset(train, range(4))  # not in memory as tensors: stays
    splits = data.Splits(train, other, 10, 4)
    assert data.resident(splits, torch.device("cpu")) is splits
    moved = data.resident(splits, torch.device("meta"))  # any non-host device, testable on CPU
    assert all(t.device.type == "meta" for t in moved.train.tensors)
    assert moved.test is other and all(t.device.type == "cpu" for t in train.tensors)
    x, y = next(data.batches(moved.train, [torch.tensor([1, 2, 3])], pin=True))
    assert x.shape == (3, 3, 4, 4) and x.device.type == "meta" and y.device.type == "meta"


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("NVIDIA H100 80GB HBM3", "cuda_h100"),
        ("NVIDIA A100-SXM4-80GB", "cuda_a100"),
        ("NVIDIA GeForce RTX 4090", "cuda_rtx_4090"),
        ("NVIDIA H200", "cuda_h200"),
    ],
)
def test_device_slug_names_the_gpu_model(monkeypatch, name, slug):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert bench.device_slug(torch.device("cuda", 0)) == slug
    assert bench.device_slug(torch.device("cpu")) == "cpu"


def test_default_output_is_named_after_the_device():
    assert bench.default_out(["device=cpu"]) == "results/benchmarks/train_cpu.json"
    keys = {**bench.DEFAULTS, **noise.NOISE_DEFAULTS}  # micro_batch=64 divides its batch of 128
    assert (
        bench.default_out(["device=cpu", "micro_batch=64"], "noise_scale", keys)
        == "results/benchmarks/noise_scale_cpu.json"
    )


def test_matrix_variants_cover_every_precision_compile_and_layout():
    cfg = Config(**{**bench.DEFAULTS, "batch_size": 64, "micro_batch": 64, "bn_batch": 16})
    variants = bench.matrix_variants(cfg, ["fp32", "bf16"], [False, True], list(bench.LAYOUTS), 4)
    assert len(variants) == 2 * 2 * 3 and len({label for label, _ in variants}) == 12
    shapes = {
        label.split()[-1]: (k["batch_size"], k["micro_batch"], k["bn_batch"])
        for label, k in variants
    }
    assert shapes == {"plain": (64, 64, 64), "ghost_bn": (64, 64, 16), "accum": (256, 64, 64)}
    with pytest.raises(ConfigError, match="bn_batch < micro_batch"):
        bench.matrix_variants(cfg.replace(bn_batch=64), ["fp32"], [False], ["ghost_bn"], 4)


def test_matrix_gives_one_row_per_variant_with_ratio_trainer_over_bare(tmp_path):
    out = tmp_path / "train_cpu.json"
    result = bench.bench_matrix(
        [*TINY_FAKE, "micro_batch=32", "bn_batch=8"],
        ["fp32", "bf16"],
        [False],
        list(bench.LAYOUTS),
        accum=2,
        steps=5,
        repeats=1,
        out=str(out),
    )
    rows = result["rows"]
    assert [r["variant"] for r in rows] == [
        f"{p} eager {lay}" for p in ("fp32", "bf16") for lay in bench.LAYOUTS
    ]
    for r in rows:
        for key in ("bare_img_per_s", "trainer_img_per_s"):
            assert math.isfinite(r[key]) and r[key] > 0
        assert r["ratio"] == pytest.approx(r["trainer_img_per_s"] / r["bare_img_per_s"])
        assert all(w is not None and w > 0 for w in r["bare_warmup_s"] + r["trainer_warmup_s"])
    assert {(r["layout"], r["accum_steps"], r["bn_batch"]) for r in rows} == {
        ("plain", 1, 32),
        ("ghost_bn", 1, 8),
        ("accum", 2, 32),
    }
    assert result["warmup_steps_excluded"] == 3 and result["device"] == "cpu"
    assert json.loads(out.read_text())["rows"] == rows
    # ghost BN over plain BN at the same micro-batch, each precision: the trainer's two rows
    by = {(r["precision"], r["layout"]): r["trainer_img_per_s"] for r in rows}
    assert result["ghost_over_plain"] == [
        {"precision": p, "compile": False, "ratio": by[p, "ghost_bn"] / by[p, "plain"]}
        for p in ("fp32", "bf16")
    ]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--precisions", "fp32,fp8"], "--precisions: 'fp8'"),
        (["--compile", "maybe"], "--compile: 'maybe'"),
        (["--layouts", "ghost"], "--layouts: 'ghost'"),
        (["--matrix", "micro_batch=32", "bn_batch=32", "batch_size=32"], "bn_batch < micro_batch"),
        (["--matrix", "micro_batch=auto"], "micro_batch=auto"),
        (["--matrix", "precison=fp16"], "unknown key 'precison'"),
    ],
)
def test_bad_bench_option_is_a_one_line_error_and_writes_nothing(tmp_path, capsys, args, named):
    out = tmp_path / "r.json"
    code = cli.main(["bench", "train", "--out", str(out), *args, *TINY_FAKE])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_BAD_INPUT and named in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.cuda
@pytest.mark.slow
def test_on_cuda_the_data_live_on_the_gpu_and_both_sides_measure_there(tmp_path):
    cfg = Config(
        dataset="fake",
        fake_train=64,
        fake_test=16,
        fake_image_size=16,
        fake_classes=10,
        device="cuda",
    )
    splits = data.build(cfg)  # the run's device by default
    assert all(t.is_cuda for t in (*splits.train.tensors, *splits.test.tensors))
    keys = [
        *(k for k in TINY_FAKE if k != "device=cpu"),
        "device=cuda",
        "micro_batch=32",
        "bn_batch=8",
    ]
    result = bench.bench_matrix(
        keys,
        ["bf16", "fp16"],
        [False],
        ["plain", "ghost_bn"],
        accum=2,
        steps=5,
        repeats=1,
        out=str(tmp_path / "r.json"),
    )
    assert result["device"].startswith("cuda_") and result["environment"]["gpu"]
    assert len(result["rows"]) == 4
    for r in result["rows"]:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0


# ``lbsgd bench noise``: the cost of noise_scale=true, step time with / without, per layout
def test_noise_layouts_take_micro_batch_half_batch_and_the_per_process_share_as_b_small():
    cfg = Config(**{**bench.DEFAULTS, **noise.NOISE_DEFAULTS})  # batch 128 of micro-batches of 32
    layouts = noise.noise_layouts(cfg, nproc=2)
    assert [(name, n) for name, _, n, _ in layouts] == [("accum", 1), ("half", 1), ("ddp", 2)]
    derived = {}
    for name, _, n, keys in layouts:
        on = cfg.replace(noise_scale=True, **keys)
        derived[name] = derive(on, n, 32_000)
    a, h, p = derived["accum"], derived["half"], derived["ddp"]
    assert (a.noise_batch, a.micro_batch, a.accum_steps) == (32, 32, 4)  # a small batch per micro
    assert (h.noise_batch, h.accum_steps) == (64, 4)  # two small batches of two micro-batches
    # two processes of 2 micro-batches: B_small is each process's share, read by the DDP hook only
    assert (p.noise_batch, p.accum_steps) == (64, 2) and p.noise_batch == p.accum_steps * 32
    assert [name for name, *_ in noise.noise_layouts(cfg, nproc=0)] == ["accum", "half"]


@pytest.mark.parametrize(
    ("keys", "nproc", "named"),
    [
        ({"batch_size": 96}, 2, "even number"),
        ({"batch_size": 32}, 2, "even number"),
        ({}, 1, "--nproc=1"),
        ({}, 3, "--nproc=3"),
    ],
)
def test_noise_layouts_the_batch_cannot_make_are_refused_in_one_line(keys, nproc, named):
    cfg = Config(**{**bench.DEFAULTS, **noise.NOISE_DEFAULTS, **keys})
    with pytest.raises(ConfigError, match=named) as e:
        noise.noise_layouts(cfg, nproc)
    assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["noise_scale=true"], "sets noise_scale and noise_scale_batch itself"),
        (["noise_scale_batch=8"], "sets noise_scale and noise_scale_batch itself"),
        (["--nproc", "3"], "--nproc=3"),
        (["--repeats", "0"], "--repeats=0"),
        (["batch_size=24"], "even number"),
    ],
)
def test_bad_noise_bench_input_is_a_one_line_error_and_writes_nothing(
    tmp_path, capsys, args, named
):
    out = tmp_path / "r.json"
    base = [*TINY_FAKE, "batch_size=32", "micro_batch=8", "bn_batch=8"]
    code = cli.main(["bench", "noise", "--out", str(out), *base, *args])  # later keys win
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_BAD_INPUT and named in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_noise_bench_gives_a_step_time_ratio_for_every_layout(tmp_path):
    out = tmp_path / "noise_scale_cpu.json"
    keys = [*TINY_FAKE, "batch_size=32", "micro_batch=8", "bn_batch=8"]
    result = noise.bench_noise(keys, steps=5, repeats=1, nproc=2, out=str(out))
    rows = result["rows"]
    assert [(r["layout"], r["nproc"], r["noise_scale_batch"]) for r in rows] == [
        ("accum", 1, 8),
        ("half", 1, 16),
        ("ddp", 2, 16),
    ]
    for r in rows:
        (off,), (on,) = r["all_off_img_per_s"], r["all_on_img_per_s"]  # one repeat (median: below)
        assert math.isfinite(off) and off > 0 and math.isfinite(on) and on > 0
        assert r["paired_ratios"] == pytest.approx([off / on])  # step time with / without
        assert r["ratio"] == pytest.approx(off / on)
        assert r["ratio_of_medians"] == pytest.approx(
            r["on_step_ms_median"] / r["off_step_ms_median"]
        )
        assert r["overhead_pct"] == pytest.approx(100 * (r["ratio"] - 1))
        assert math.isfinite(r["ratio_best"]) and r["ratio_best"] > 0
        assert r["target_pct"] == 5.0 and r["within_target"] == (r["overhead_pct"] <= 5.0)
    assert result["target_pct"] == 5.0 and result["device"] == "cpu" and result["left_out"] == {}
    assert result["environment"]["torch"] and result["warmup_steps_excluded"] == 3
    assert json.loads(out.read_text())["rows"] == rows


def test_noise_bench_alternates_the_sides_and_takes_the_median_of_the_paired_ratios(
    tmp_path, monkeypatch
):
    """Three repeats, the trainer's throughputs scripted: the sides run off-on, on-off, off-on
    (after one untimed warm-up run), and the ratio is the median of each repeat's step time with
    the measurement over the same repeat's without."""
    sides, scripted = [], {False: [100.0, 100.0, 120.0], True: [50.0, 80.0, 100.0]}

    def fake_run(cfg, steps, num_train, out_dir):
        sides.append(cfg.noise_scale)
        if len(sides) == 1:  # the untimed warm-up
            return bench.Timing(1.0, None)
        return bench.Timing(scripted[cfg.noise_scale].pop(0), 0.1)

    monkeypatch.setattr(noise, "trainer_run", fake_run)
    keys = [*TINY_FAKE, "batch_size=32", "micro_batch=8", "bn_batch=8"]
    (row,) = noise.bench_noise(keys, steps=5, repeats=3, layouts=["accum"])["rows"]
    assert sides == [False, False, True, True, False, False, True]
    assert row["all_off_img_per_s"] == [100.0, 100.0, 120.0]
    assert row["all_on_img_per_s"] == [50.0, 80.0, 100.0]
    assert row["paired_ratios"] == pytest.approx([2.0, 1.25, 1.2])
    assert row["ratio"] == pytest.approx(1.25)  # the median, not the mean (1.483)
    assert row["overhead_pct"] == pytest.approx(25.0)


# -- lbsgd bench caps: one run under each CPU-kernel cap ---------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--caps", "avx2"], "--caps=avx2: give two or more distinct caps"),
        (["--caps", "avx2,avx2"], "--caps=avx2,avx2: give two or more distinct caps"),
        (["--caps", "native,avx3"], "(valid: native, portable, avx2"),
        (["--repeats", "0"], "--repeats=0 must be a positive integer"),
        (["--caps", "native,portable", "batch_size=-256"], "batch_size"),
    ],
)
def test_bad_caps_bench_input_is_a_one_line_error_and_writes_nothing(tmp_path, capsys, args, named):
    out = tmp_path / "caps.json"
    code = cli.main(["bench", "caps", "--out", str(out), *args])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_BAD_INPUT and named in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(
    not {"avx2", "fma"} <= set(isa.cpu_flags() or []), reason="needs an x86 CPU with AVX2 and FMA"
)
def test_caps_bench_measures_each_cap_in_its_own_process_and_gives_ratios(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    keys = as_args({**tiny_subset(["model", "depth", "width", "synthetic_train"]), "epochs": 1})
    out = tmp_path / "caps.json"
    code = cli.main(
        ["bench", "caps", "--caps", "native,avx2", "--repeats", "1", "--out", str(out)]
        + keys
        + ["batch_size=64", "bn_batch=16", "reference_batch=64", "device=cpu"]
    )
    assert code == 0
    result = json.loads(out.read_text())
    caps = result["caps"]
    assert result["baseline"] == "native" and list(caps) == ["native", "avx2"]
    for cap, row in caps.items():  # each run held the cap it was measured under
        assert row["cpu_isa_record"]["requested"] == cap and row["cpu_isa_record"]["in_effect"]
        assert row["img_per_s"] == [row["best"]] and row["best"] > 0
    assert caps["native"]["ratio_best"] == 1.0
    assert caps["avx2"]["ratio_best"] == caps["avx2"]["best"] / caps["native"]["best"]


@pytest.mark.slow
def test_ghost_bn_bench_times_one_pass_loop_and_plain_and_states_their_ratios(tmp_path):
    """`lbsgd bench ghost-bn`: a row per group count, each kernel's throughput measured in this
    invocation and the ratios of them, written as JSON."""
    from lbsgd.bench import ghost

    out = tmp_path / "ghost.json"
    result = ghost.bench_ghost(
        [*TINY_FAKE, "micro_batch=16", "batch_size=16", "bn_batch=16"],
        (2, 4),
        steps=2,
        repeats=1,
        out=str(out),
    )
    rows = result["rows"]
    assert [(r["groups"], r["bn_batch"]) for r in rows] == [(2, 8), (4, 4)]
    for r in rows:
        assert r["one_pass_over_loop"] == r["one_pass_img_per_s"] / r["loop_img_per_s"]
        assert r["one_pass_over_plain"] == r["one_pass_img_per_s"] / r["plain_img_per_s"]
        assert all(len(v) == 1 and v[0] > 0 for v in r["all_img_per_s"].values())
        assert r["page_faults_per_step"].keys() == r["all_img_per_s"].keys()
        assert all(len(v) == 1 and v[0] >= 0 for v in r["page_faults_per_step"].values())
    assert json.loads(out.read_text())["rows"] == rows
    assert result["allocator"] == ghost.keep_freed_memory()  # what the bench did, said


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_with_freed_memory_kept_a_block_allocated_again_takes_no_page_faults():
    """What makes the ghost-BN bench measure kernels, not the allocator: under glibc's defaults a
    freed 64 MiB block is unmapped and allocating it again faults its 16,384 pages in anew; kept
    (`keep_freed_memory`), it is reused without one. In a fresh process each way."""
    script = (
        "import sys, torch\n"
        "from lbsgd.bench.ghost import keep_freed_memory, _page_faults\n"
        "if sys.argv[1] == 'kept':\n"
        "    keep_freed_memory()\n"
        "for _ in range(8):\n"
        "    before = _page_faults()\n"
        "    torch.ones(16 << 20)\n"
        "    print(_page_faults() - before)\n"
    )
    faults = {
        way: [
            int(line)
            for line in subprocess.run(
                [sys.executable, "-c", script, way], check=True, capture_output=True, text=True
            ).stdout.split()
        ]
        for way in ("default", "kept")
    }
    # the first allocations place the block either way; from the fifth on, the steady state
    assert all(f >= 16_000 for f in faults["default"][4:]), faults
    assert faults["kept"][4:] == [0, 0, 0, 0], faults


def test_ghost_bn_bench_refuses_a_group_count_that_does_not_split_the_micro_batch(capsys):
    assert cli.main(["bench", "ghost-bn", "--groups", "3", "micro_batch=16", "batch_size=16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--groups: 3" in err and "micro_batch=16" in err


@pytest.mark.slow
def test_a_trainer_run_asked_to_stop_is_an_interrupt_of_the_benchmark_not_a_failure(tmp_path):
    """Ctrl-C while a benchmark's trainer side trains (a real SIGINT once it has flushed a step):
    the trainer stops at its next flush, and the benchmark is interrupted (KeyboardInterrupt:
    ``lbsgd bench`` ends in one line, exit 130), not a measurement that failed."""

    def ctrl_c_once_training() -> None:
        while not any('"train"' in f.read_text() for f in tmp_path.rglob("metrics.jsonl")):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_once_training, daemon=True).start()
    cfg = from_dict(tiny_keys(checkpoint=False))
    with pytest.raises(KeyboardInterrupt, match="the trainer stopped at step [1-9]"):
        bench.trainer_run(cfg, 5000, 512, str(tmp_path))
