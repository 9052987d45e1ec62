"""The digits of one short lbsgd run under a CPU-kernel cap, to compare across CPU vendors.

    python tools/digests.py --cap portable                      # this machine
    python tools/digests.py --cap portable --runner "qemu-x86_64 -cpu Haswell" \
        --measured-on "Intel Haswell (GenuineIntel), emulated by QEMU user mode"

trains ``results/portability/digests.json``'s keys with ``cpu_isa=CAP`` (under ``--runner``, e.g.
QEMU's user-mode emulator presenting another vendor's CPU to every library), and prints one JSON
entry: every train loss, a sha256 of the final weights (lbsgd.lab.verify.fingerprint), the cap's
record from summary.json and where it was measured. ``--add`` appends the entry to the file.
tests/test_portable.py trains the same keys here and compares.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from lbsgd import isa
from lbsgd.lab import verify

FILE = Path(__file__).resolve().parents[1] / "results" / "portability" / "digests.json"


def measure(keys: dict, cap: str, runner: list[str], out: Path) -> dict:
    args = [f"{k}={v}" for k, v in keys.items()]
    cmd = [*runner, sys.executable, "-m", "lbsgd", "train", *args, f"cpu_isa={cap}"]
    cmd += [f"out_dir={out}", "study=portable", "name=r", "resume=false"]
    env = {k: v for k, v in os.environ.items() if k not in isa.VARIABLES}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the run failed (exit code {proc.returncode}): {proc.stderr[-2000:]}")
    run = out / "portable" / "r"
    record = json.loads((run / "summary.json").read_text())["environment"]["cpu_isa"]
    return {**verify.fingerprint(run), "cpu_isa": cap, "cpu_isa_record": record}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cap", required=True, choices=list(isa.CAPS))
    p.add_argument("--runner", default="", help="command the run starts under, e.g. an emulator")
    p.add_argument("--measured-on", default=None, help="the CPU, in words (default: this one's)")
    p.add_argument("--add", action="store_true", help=f"append the entry to {FILE}")
    args = p.parse_args()
    doc = json.loads(FILE.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        entry = measure(doc["keys"], args.cap, shlex.split(args.runner), Path(tmp))
    entry = {
        "measured_on": args.measured_on or f"{isa.cpu_model()} ({isa.cpu_vendor()})",
        "runner": args.runner or None,
        **entry,
    }
    print(json.dumps(entry, indent=1))
    if args.add:
        doc["machines"].append(entry)
        FILE.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
