"""cpu_isa=portable gives the same digits on CPUs of different vendors: a short run trained here is
compared with results/portability/digests.json, the same keys measured by tools/digests.py on an
AMD EPYC and on an Intel CPU presented to every library by QEMU's user-mode emulator. On an Intel
machine this is the comparison with another vendor's measurement; on an AMD one, with the
emulated Intel's."""

import json
from pathlib import Path

import pytest
from conftest import as_args, lbsgd

from lbsgd import isa
from lbsgd.lab import verify

FILE = Path(__file__).resolve().parents[1] / "results" / "portability" / "digests.json"
DOC = json.loads(FILE.read_text())
needs_avx2 = pytest.mark.skipif(
    not {"avx2", "fma"} <= set(isa.cpu_flags() or []), reason="needs an x86 CPU with AVX2 and FMA"
)


def _measured(cap: str) -> list[dict]:
    return [m for m in DOC["machines"] if m["cpu_isa"] == cap]


def _digits(entry: dict) -> tuple:
    return tuple(entry["losses"]), entry["weights_sha256"]


def test_the_portable_measurements_were_made_on_two_vendors_and_agree():
    portable = _measured("portable")
    assert len({m["measured_on"] for m in portable}) >= 2
    assert any("Intel" in m["measured_on"] for m in portable)
    assert any("AMD" in m["measured_on"] for m in portable)
    assert len({_digits(m) for m in portable}) == 1
    for m in portable:  # each measured run held its caps
        assert m["cpu_isa_record"]["in_effect"] and m["cpu_isa_record"]["mkl_cbwr"] == "COMPATIBLE"


@pytest.mark.slow
@needs_avx2
def test_a_portable_run_here_gives_the_digits_measured_on_every_vendor(tmp_path):
    keys = {**DOC["keys"], "cpu_isa": "portable", "out_dir": str(tmp_path), "study": "p"}
    r = lbsgd(["train", *as_args(keys), "name=r"], env=dict.fromkeys(isa.VARIABLES))
    assert r.returncode == 0, r.stderr[-3000:]
    here = verify.fingerprint(tmp_path / "p" / "r")
    assert len(here["losses"]) == len(_measured("portable")[0]["losses"])
    for m in _measured("portable"):
        assert _digits(here) == _digits(m), m["measured_on"]
