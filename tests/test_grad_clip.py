"""``grad_clip`` (lbsgd.features.GradClip on the step's hook between unscaling and the optimizer
step): the run's weights are bitwise those of the plain recipe, ``clip_grad_norm_`` after
``GradScaler.unscale_`` before ``optimizer.step()`` (tests/clip_worker.py), on one process, in
fp16, and on two processes accumulating two micro-batches each; each step logs its norm before
clipping; the key is refused where it cannot hold and leaves every other run's name as it was."""

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import as_args, lbsgd, tiny_keys, used_keys
from helpers import EIGHT_STEP_EPOCHS

from lbsgd import checkpoint, config
from lbsgd.config import Config, ConfigError

CLIP_WORKER = str(Path(__file__).parent / "clip_worker.py")
CLIP = 0.5  # below the tiny run's gradient norms (about 1 to 3): most steps are clipped
# 8 steps (256 images, batch 32: one epoch), a flush every 2 steps, ghost BN groups of 8
KEYS = tiny_keys(**EIGHT_STEP_EPOCHS, bn_batch=8, epochs=1)


def _train(out: Path, name: str, nproc: int | None, plain: bool, **extra) -> Path:
    """The run ``name``: clipped by ``grad_clip`` (``plain``: by the optimizer's own step,
    tests/clip_worker.py); its folder."""
    keys = used_keys({**KEYS, **extra, "out_dir": str(out), "name": name})
    if not plain:
        keys["grad_clip"] = CLIP
    program = (CLIP_WORKER,) if plain else ("-m", "lbsgd")
    env = {"LBSGD_TEST_PLAIN_CLIP": str(CLIP) if plain else None}
    r = lbsgd(["train", *as_args(keys)], nproc, program=program, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "runs" / name


def _records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc, extra",
    [
        (None, {}),
        # a loss scale that overflows the first steps: skipped, their norm inf, as the plain
        # recipe skips them (GradScaler.step never calls the optimizer's step)
        (None, {"precision": "fp16", "loss_scale": 2.0**24}),
        (2, {"micro_batch": 8}),  # 2 processes x 2 micro-batches of 8 (ghost BN groups of 8)
    ],
    ids=["one-process", "fp16", "two-processes-accumulating"],
)
def test_clipped_weights_are_bitwise_the_plain_recipes(tmp_path, nproc, extra):
    ours = _train(tmp_path, "feature", nproc, plain=False, **extra)
    plain = _train(tmp_path, "plain", nproc, plain=True, **extra)
    a, b = checkpoint.load(ours), checkpoint.load(plain)
    assert a["step"] == b["step"] == 8
    for key, value in b["model"].items():  # parameters and BN buffers
        assert torch.equal(a["model"][key], value), key
    for key, value in b["optimizer"]["state"].items():  # momentum buffers
        for name, t in value.items():
            assert torch.equal(torch.as_tensor(a["optimizer"]["state"][key][name]), t), key
    norms = [float(r["grad_norm"]) for r in _records(ours)]  # "inf" or "nan" when skipped
    skipped = json.loads((ours / "summary.json").read_text())["skipped_steps"]
    assert len(norms) == 8 and sum(not math.isfinite(n) for n in norms) == skipped
    assert (skipped > 0) == ("loss_scale" in extra)
    finite = [n for n in norms if math.isfinite(n)]
    assert all(n > 0 for n in finite)
    assert sum(n > CLIP for n in finite) >= 3  # the clip acted: the equality is not vacuous
    assert all("grad_norm" not in r for r in _records(plain))


def test_the_key_is_refused_where_it_cannot_hold_and_named_only_when_set():
    plain = Config(**KEYS)
    assert Config(**{**KEYS, "grad_clip": None}).experiment_id() == plain.experiment_id()
    assert Config(**{**KEYS, "grad_clip": 1.0}).experiment_id() != plain.experiment_id()
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=r"grad_clip=.* must be a global L2 norm > 0"):
            config.from_dict({**KEYS, "grad_clip": bad})
    with pytest.raises(ConfigError, match=r"grad_clip=1.0 clips .* \(valid: local_sgd=0"):
        config.from_dict({**KEYS, "grad_clip": 1.0, "local_sgd": 2})
    with pytest.raises(ConfigError, match=r"not with grad_clip=1.0 \(valid: grad_clip=null\)"):
        config.from_dict({**KEYS, "grad_clip": 1.0, "async_ps": True, "resume": False})
