"""Stands in for a GPU node's python3 under tools/gpu-check.sh (tests/test_gpu_check.py): every
command line is recorded in $GPU_CHECK_LOG, and each ``-m lbsgd ...`` is parsed by lbsgd's own
parser with its keys validated, not run; ``-c`` (the GPU's name) prints cuda_h100."""

import json
import os
import sys

from lbsgd import cli, config

args = sys.argv[1:]
with open(os.environ["GPU_CHECK_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if args[:1] == ["-c"]:
    print("cuda_h100")
elif args[:2] == ["-m", "lbsgd"]:
    parsed = cli.parser().parse_args(args[2:])  # exits 2 on an unknown option
    config.from_dict(config.parse_overrides(getattr(parsed, "overrides", [])))
