"""The CPU kernels' instruction-set cap (cpu_isa, lbsgd.isa) and what the environment record holds."""

import json
import os

import pytest
import torch
from conftest import TINY, as_args, lbsgd

from lbsgd import data, isa
from lbsgd.config import Config, ConfigError
from lbsgd.data import fake_files
from lbsgd.entry import train
from lbsgd.environment import dataset_digest

FLAGS = isa.cpu_flags() or []
needs_avx2 = pytest.mark.skipif(
    not {"avx2", "fma"} <= set(FLAGS), reason="needs an x86 CPU with AVX2 and FMA"
)


def _keys(tmp_path, **kw) -> dict:
    return {**TINY, "epochs": 1, "out_dir": str(tmp_path / "results"), "name": "r", **kw}


def _cli_run(tmp_path, **kw) -> dict:
    """A TINY run by ``python -m lbsgd train`` in a fresh process: its summary and weights."""
    keys = _keys(tmp_path, **kw)
    r = lbsgd(["train", *as_args(keys)], env=dict.fromkeys(isa.VARIABLES))  # no cap inherited
    assert r.returncode == 0, r.stderr[-3000:]
    return _read(tmp_path)


def _read(tmp_path) -> dict:
    run = tmp_path / "results" / "runs" / "r"
    weights = torch.load(run / "checkpoint.pt", weights_only=False)["model"]
    return {
        "summary": json.loads((run / "summary.json").read_text()),
        "weights": weights,
        "metrics": (run / "metrics.jsonl").read_text(),
    }


def _bitwise_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_importing_lbsgd_and_its_cli_leaves_torch_unimported():
    """What lets `python -m lbsgd train` set the caps before torch's libraries read them."""
    code = "import sys, lbsgd, lbsgd.cli, lbsgd.isa; print('torch' in sys.modules)"
    r = lbsgd([], program=("-c", code))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "False"


@pytest.mark.slow
@needs_avx2
@pytest.mark.parametrize("cap", ["avx2", "portable"])
def test_capped_run_pins_its_caps_and_repeats_bitwise_from_the_cli_and_a_fresh_python(
    tmp_path, cap
):
    cli = _cli_run(tmp_path / "cli", cpu_isa=cap)
    record = cli["summary"]["environment"]["cpu_isa"]
    assert record["variables"] == isa.CAPS[cap]
    assert record["requested"] == cap and record["pinned_before_torch"] is True
    assert record["aten"] == "AVX2"  # torch.backends.cpu.get_cpu_capability() in the run
    if cap == "portable":  # ATen's own convolutions: oneDNN runs none
        assert record["onednn"] is None and record["onednn_convolutions"] is False
    else:
        assert record["onednn"] in ("sse41", "avx", "avx2", None)
    # MKL's branch, asked on both paths: the cap's own on Intel, AUTO for an ISA branch elsewhere
    assert record["mkl_cbwr"] == isa.mkl_branch(cap, isa.cpu_vendor())
    assert record["in_effect"] is True
    # the same run trained in-process by a Python that has run no torch operation yet: the
    # trainer pins the caps itself
    keys = _keys(tmp_path / "inproc", cpu_isa=cap)
    code = f"from lbsgd import Config, train; train(Config(**{keys!r}))"
    r = lbsgd([], program=("-c", code), env=dict.fromkeys(isa.VARIABLES))  # no cap inherited
    assert r.returncode == 0, r.stderr[-3000:]
    inproc = _read(tmp_path / "inproc")
    inproc_record = inproc["summary"]["environment"]["cpu_isa"]
    same = ("aten", "onednn", "mkl_cbwr", "onednn_convolutions", "in_effect", "cpu_vendor")
    assert {k: inproc_record[k] for k in same} == {k: record[k] for k in same}
    assert inproc_record["pinned_before_torch"] is False  # the other path, the same facts
    assert _bitwise_equal(cli["weights"], inproc["weights"])
    losses = [json.loads(line)["loss"] for line in cli["metrics"].splitlines() if '"train"' in line]
    assert losses == [
        json.loads(line)["loss"] for line in inproc["metrics"].splitlines() if '"train"' in line
    ]


@pytest.mark.slow
@needs_avx2
def test_portable_cap_gives_other_digits_than_oneDNN_would_on_this_cpu(tmp_path):
    """The cap changes what runs (ATen's convolutions, MKL's COMPATIBLE branch), hence the
    digits: were oneDNN or MKL's automatic branch still at work, the runs would agree."""
    avx2 = _cli_run(tmp_path / "avx2", cpu_isa="avx2")
    portable = _cli_run(tmp_path / "portable", cpu_isa="portable")
    assert not _bitwise_equal(avx2["weights"], portable["weights"])


def test_mkl_is_held_to_the_branch_it_honours_on_each_vendor():
    # measured: MKL_CBWR=COMPATIBLE is CNR:COMPATIBLE on an AMD EPYC; MKL_CBWR=AVX2 is CNR:AUTO
    # there (MKL follows an instruction-set branch only on Intel's CPUs)
    assert isa.mkl_branch("portable", "AuthenticAMD") == "COMPATIBLE"
    assert isa.mkl_branch("portable", "GenuineIntel") == "COMPATIBLE"
    assert isa.mkl_branch("portable", None) == "COMPATIBLE"
    assert isa.mkl_branch("avx2", "GenuineIntel") == "AVX2"
    assert isa.mkl_branch("avx2", "AuthenticAMD") == "AUTO"
    assert isa.mkl_branch("avx512_core", "GenuineIntel") == "AVX512"
    assert isa.mkl_branch("avx2", None) is None  # vendor unknown: not judged
    assert isa.mkl_branch("native", "GenuineIntel") is None
    flags = ["avx2", "fma"]
    amd = {"aten": "AVX2", "onednn": "avx2", "mkl_cbwr": "AUTO"}
    assert isa.problems("avx2", amd, flags, "AuthenticAMD") == []
    assert isa.problems("avx2", amd, flags, "GenuineIntel") == [
        "MKL's branch is CNR:AUTO, not AVX2"
    ]
    ok = {"aten": "AVX2", "onednn": None, "mkl_cbwr": "COMPATIBLE"}
    assert isa.problems("portable", ok, flags, "AuthenticAMD") == []
    assert isa.problems("portable", {**ok, "onednn": "avx2"}, flags, "AuthenticAMD") == [
        "oneDNN's convolutions run (avx2), not ATen's"
    ]
    assert isa.problems("portable", {**ok, "mkl_cbwr": "AUTO"}, flags, "GenuineIntel") == [
        "MKL's branch is CNR:AUTO, not COMPATIBLE"
    ]


@pytest.mark.slow
@pytest.mark.skipif("avx512f" not in FLAGS, reason="needs an AVX-512 CPU (natively above AVX2)")
def test_cap_changes_the_digits_of_a_run_on_an_avx512_cpu(tmp_path):
    native = _cli_run(tmp_path / "native", cpu_isa="native")
    capped = _cli_run(tmp_path / "capped", cpu_isa="avx2")
    assert native["summary"]["environment"]["cpu_isa"]["aten"] == "AVX512"
    assert native["summary"]["environment"]["cpu_isa"]["variables"] == {}
    assert not _bitwise_equal(native["weights"], capped["weights"])


@pytest.mark.skipif(
    any(k in os.environ for k in isa.VARIABLES), reason="this session was started with caps set"
)
def test_cap_asked_of_a_process_whose_kernels_already_ran_is_refused_in_one_line(tiny, tmp_path):
    torch.mm(torch.ones(4, 4), torch.ones(4, 4))  # MKL (and ATen) have chosen their path now
    with pytest.raises(ConfigError) as e:
        train(tiny(cpu_isa="avx2"))
    message = str(e.value)
    assert "\n" not in message and "cpu_isa=avx2 cannot take effect" in message
    assert "python -m lbsgd train" in message
    assert not any(k in os.environ for k in isa.VARIABLES)  # the environment as it was
    assert isa.in_force()["pinned_before_torch"] is None  # and its record
    assert not (tmp_path / "results").exists()  # nothing written


def test_problems_name_each_library_that_does_not_follow_the_cap():
    at_cap = {"aten": "AVX2", "onednn": "avx2", "mkl_cbwr": "AVX2"}
    assert isa.problems("avx2", at_cap, ["avx2", "fma"]) == []
    assert isa.problems("avx2", {"aten": "AVX2", "onednn": None, "mkl_cbwr": None}, None) == []
    assert isa.problems("native", {"aten": "AVX512"}, []) == []
    assert isa.problems("avx512_core", at_cap, ["avx2", "fma"]) == [
        "this CPU lacks avx512f, avx512bw, avx512vl, avx512dq"
    ]
    native = {"aten": "AVX512", "onednn": "avx512_core", "mkl_cbwr": "OFF"}
    wrong = isa.problems("avx2", native, ["avx2", "fma", "avx512f"], "GenuineIntel")
    assert wrong == [
        "ATen's kernels use AVX512, not AVX2",
        "oneDNN's convolutions use avx512_core",
        "MKL's branch is CNR:OFF, not AVX2",
    ]
    # AMX's cap allows oneDNN's AVX-512 convolutions (AMX has no float32 path)
    flags = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile"]
    amx = {"aten": "AVX512", "onednn": "avx512_core", "mkl_cbwr": "AVX512"}
    assert isa.problems("avx512_core_amx", amx, flags, "GenuineIntel") == []


def test_environment_records_cpu_caps_build_and_dataset_digest(tiny):
    cfg = tiny()
    env = train(cfg)["environment"]
    assert env["cpu_model"] and isinstance(env["cpu_model"], str)
    if FLAGS:
        assert env["isa_flags"] == sorted(
            f for f in FLAGS if f.startswith(("avx", "amx")) or f in ("fma", "f16c")
        )
    assert env["cpu_isa"]["requested"] == "native"
    assert env["cpu_isa"]["aten"] == torch.backends.cpu.get_cpu_capability()
    assert len(env["torch_build"]["sha1"]) == 40
    if torch.backends.mkl.is_available():
        assert any("Math Kernel Library" in line for line in env["torch_build"]["cpu_libraries"])
    expected = dataset_digest(data.build(cfg, torch.device("cpu")).train)
    assert env["dataset_digest"] == {**expected, "samples": TINY["synthetic_train"]}
    assert expected["over"] == "tensors" and len(expected["sha1"]) == 40


def _digest(**kw) -> str:
    cfg = Config(**{**TINY, **kw})
    return dataset_digest(data.build(cfg, torch.device("cpu")).train)["sha1"]


def test_dataset_digest_is_equal_for_equal_data_and_differs_for_other_data():
    fake = {"dataset": "fake", "fake_train": 64, "fake_test": 16, "fake_image_size": 8}
    assert _digest(**fake, seed=0) == _digest(**fake, seed=0)
    assert _digest(**fake, seed=0) != _digest(**fake, seed=1)
    assert _digest() == _digest()
    assert _digest() != _digest(synthetic_noise=0.2)
    assert _digest() != _digest(synthetic_train=TINY["synthetic_train"] + 10)


def test_dataset_digest_of_files_follows_their_list_and_sizes(tmp_path):
    def digest(root):
        return dataset_digest(
            data.build(Config(**{**TINY, "dataset": "imagenet", "data_dir": str(root)})).train
        )

    for name in ("a", "b"):
        fake_files.write_imagenet(tmp_path / name, 4, 2, 2, (40, 30), seed=0)
    first = digest(tmp_path / "a")
    assert first["over"] == "files" and first["samples"] == 4
    assert digest(tmp_path / "b") == first  # the same files elsewhere
    some = next((tmp_path / "b" / "train").glob("*/*.JPEG"))
    some.write_bytes(some.read_bytes() + b"\0")
    assert digest(tmp_path / "b")["sha1"] != first["sha1"]
    fake_files.write_cifar10(tmp_path / "c", 10, 5, seed=0)
    fake_files.write_cifar10(tmp_path / "d", 10, 5, seed=1)
    cifar = [
        dataset_digest(
            data.build(
                Config(**{**TINY, "dataset": "cifar10", "data_dir": str(tmp_path / x)})
            ).train
        )
        for x in "cd"
    ]
    assert cifar[0]["over"] == "tensors" and cifar[0]["sha1"] != cifar[1]["sha1"]


def test_cap_above_what_the_cpu_has_is_refused_before_anything_is_set(monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: ["sse2", "avx"])
    before = {k: os.environ.get(k) for k in isa.VARIABLES}
    with pytest.raises(ConfigError, match=r"^cpu_isa=avx2: this CPU lacks avx2, fma; use a lower"):
        isa.require("avx2")
    assert {k: os.environ.get(k) for k in isa.VARIABLES} == before
