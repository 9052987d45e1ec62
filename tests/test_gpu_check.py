"""tools/gpu-check.sh: each step's command lines are valid lbsgd command lines (parsed by lbsgd's
own parser, keys validated) and write where the step says, without a GPU: a stand-in interpreter
(tests/gpu_check_python.py) records and checks each line instead of running it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu-check.sh"
STAND_IN = Path(__file__).parent / "gpu_check_python.py"


def _step(
    tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {STAND_IN} "$@"\n')
    python.chmod(0o755)
    log = tmp_path / "lines.jsonl"
    log.write_text("")
    env = subprocess_env(
        PYTHON=str(python), GPU_CHECK_LOG=str(log), DATA=str(tmp_path / "data"), **env
    )
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env)
    return r, [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
def test_each_step_runs_valid_lbsgd_command_lines_into_its_out_folder(tmp_path):
    out = tmp_path / "out"
    r, lines = _step(tmp_path, "train", str(out))
    assert r.returncode == 0, r.stderr
    benches = [a for a in lines if a[:4] == ["-m", "lbsgd", "bench", "train"]]
    r, lines = _step(tmp_path, "compiled", str(out))
    assert r.returncode == 0, r.stderr
    benches += [a for a in lines if a[:4] == ["-m", "lbsgd", "bench", "train"]]
    assert [a[a.index("--out") + 1] for a in benches] == [
        f"{out}/train_cuda_h100.json",
        f"{out}/train_compiled_cuda_h100.json",
    ]
    assert all("device=cuda" in a and "model=resnet50" in a for a in benches)
    assert [a[a.index("--compile") + 1] for a in benches] == ["false", "true"]

    r, lines = _step(tmp_path, "data", str(out))
    assert r.returncode == 0, r.stderr
    made = [a[3:5] for a in lines if a[:3] == ["-m", "lbsgd", "data"]]
    assert made == [["fake", "imagenet"], ["fake", "cifar10"]]
    outs = [a[a.index("--out") + 1] for a in lines if a[:4] == ["-m", "lbsgd", "bench", "data"]]
    assert outs == [f"{out}/data_{n}.json" for n in ("cifar10", "imagenet_w8", "imagenet_w15")]

    r, lines = _step(tmp_path, "noise", str(out))
    assert r.returncode == 0, r.stderr
    assert lines[-1][:4] == ["-m", "lbsgd", "bench", "noise"]
    assert lines[-1][-1] == f"{out}/noise_scale_cuda_h100.json"

    r, lines = _step(tmp_path, "ghost", str(out))
    assert r.returncode == 0, r.stderr
    ghost = [a for a in lines if a[:4] == ["-m", "lbsgd", "bench", "ghost-bn"]]
    assert [a[a.index("--out") + 1] for a in ghost] == [
        f"{out}/ghost_bn_cuda_h100_{p}_{c}.json"
        for p in ("fp32", "bf16", "fp16")
        for c in ("false", "true")
    ]
    # ResNet-50, micro-batch 256 in 8 groups: Goyal's 32 images a BN group
    assert all("model=resnet50" in a and "micro_batch=256" in a for a in ghost)
    assert all(a[a.index("--groups") + 1] == "8" for a in ghost)

    r, lines = _step(tmp_path, "tests", str(out))
    assert r.returncode == 0, r.stderr
    assert len(lines) == 1 and lines[0][:4] == ["-m", "pytest", "-m", "cuda"]
    # the files holding CUDA tests, and only these: the others import what a GPU node need not have
    held = sorted(
        f"tests/{p.name}"
        for p in (ROOT / "tests").glob("test_*.py")
        if "pytest.mark.cuda" in p.read_text()
    )
    files = [a for a in lines[0] if a.startswith("tests/")]
    assert (
        files == held and "tests/test_cuda.py" in files and "tests/test_notebooks.py" not in files
    )
    assert (out / "cuda_tests.txt").exists()


def test_a_step_without_its_out_folder_or_an_unknown_step_is_refused(tmp_path):
    r, lines = _step(tmp_path, "train")
    assert r.returncode == 2 and "give the folder the results go to (OUT)" in r.stderr
    assert lines == []  # nothing ran
    r, lines = _step(tmp_path, "bench")
    assert r.returncode == 2 and "tools/gpu-check.sh setup" in r.stderr and lines == []


def test_studies_runs_each_committed_config_on_cuda_smallest_batch_first(tmp_path):
    configs = tmp_path / "configs"
    for name, batch in (("big", 256), ("small", 16), ("middle", 64)):
        (configs / "warmup" / name).mkdir(parents=True)
        (configs / "warmup" / name / "config.yaml").write_text(f"batch_size: {batch}\nseed: 0\n")
    out = tmp_path / "out"
    r, lines = _step(
        tmp_path, "studies", str(out), CONFIGS=str(configs), JOBS="1", EXTRA="micro_batch=auto"
    )
    assert r.returncode == 0, r.stderr
    runs = [a for a in lines if a[:4] == ["-m", "lbsgd", "train", "-c"]]
    # one line per config, the smallest batch first (it runs longest), each onto the GPU
    assert [Path(a[4]).parent.name for a in runs] == ["small", "middle", "big"]
    assert all(a[5:] == ["device=cuda", f"out_dir={out}/studies", "micro_batch=auto"] for a in runs)
    assert sorted(p.name for p in (out / "studies").glob("*.log")) == [
        "big.log",
        "middle.log",
        "small.log",
    ]
