# Two commands set everything up: `make reproduce` (the main job) and `make test`.
# Both create and fill .venv first when needed (`make setup`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test lint format reproduce verify lab lab-copies train-quickstart bench bench-gpu bench-comm bench-noise bench-caps wheels clean

setup: $(STAMP)

# constraints.txt pins the tested versions of everything (torch/torchvision included).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,notebooks]'
	touch $(STAMP)

# The suite on every core (pytest-xdist), a test file per worker at a time: a file's module
# fixtures (the smoke notebooks' shared results, a resume study) are built once. TEST_WORKERS=0
# runs it in this process.
TEST_WORKERS ?= auto
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The main job (lbsgd reproduce): every study notebook the profile replays executed through
# papermill (lbsgd execute: one line on a bad parameter or Ctrl-C, which stops the runs with a
# checkpoint), each given the launch parameters it declares, its executed copy saved beside its
# results in $(OUT)/$(PROFILE)/<study>/, then $(OUT)/$(PROFILE)/REPORT.md. Each profile has its
# own folder: no profile overwrites another's. Runs already complete there are skipped, so an
# interrupted `make reproduce` resumes; `OUT=elsewhere` replays from scratch; `make -n reproduce`
# shows the command, and adding `--dry-run` to it prints each notebook's command line. Other
# scales: make reproduce PROFILE=cifar10 NPROC=1, PROFILE=imagenet NPROC=8 (NNODES=2
# RDZV_ENDPOINT=host:port on every node). On a Slurm cluster each run is a job: LAUNCHER=slurm
# CLUSTER=<a file of configs/cluster/ or a path, then key=value overrides> (docs/cluster.md).
OUT ?= results
PROFILE ?= cpu
NPROC ?= 1
NNODES ?= 1
RDZV_ENDPOINT ?=
PARALLEL ?= 2
LAUNCHER ?= local
CLUSTER ?=
NOTEBOOKS ?= $(sort $(wildcard notebooks/[0-9]*_*.ipynb))
LAUNCH = -p nproc_per_node $(NPROC) -p parallel $(PARALLEL) \
  $(if $(filter-out 1,$(NNODES)),-p nnodes $(NNODES) -p rdzv_endpoint "$(RDZV_ENDPOINT)") \
  $(if $(filter-out local,$(LAUNCHER)),-p launcher $(LAUNCHER) -p cluster "$(CLUSTER)")
reproduce: setup
	$(VENV)/bin/lbsgd reproduce $(PROFILE) $(NOTEBOOKS) --out $(OUT) $(strip $(LAUNCH))

# Replays a sample of the committed runs of $(OUT)/$(PROFILE) (the cheapest run of each study, a
# few minutes on 2 cores) in a temporary folder and gives each a level: bitwise equal, consistent
# (differs, final error within 2 seed spreads, no finding of its study changes verdict) or
# inconsistent; says whether this CPU and its caps are the committed run's; exit code 0 unless a
# replay is inconsistent. More: make verify VERIFY_ARGS="--sample 9".
VERIFY_ARGS ?=
verify: setup
	$(VENV)/bin/lbsgd verify --results $(OUT)/$(PROFILE) --parallel $(PARALLEL) $(VERIFY_ARGS)

# JupyterLab on lab/ (copies of notebooks/, below) with the project's environment as its kernel.
# The kernels run in lab/; the studies still write to the repository's results/<profile>/
# (lbsgd.lab.studies).
lab: setup lab-copies
	$(VENV)/bin/jupyter lab --notebook-dir=lab $(if $(filter 0,$(shell id -u)),--allow-root)

# JupyterLab works on copies of the study notebooks in lab/, which git ignores: a tweaked
# parameter, the outputs of a run and Lab's autosaves stay there, and notebooks/ stays as
# committed. A copy already in lab/ is kept (your edits); delete it to start again from notebooks/.
lab-copies:
	@mkdir -p lab && for nb in notebooks/*.ipynb; do \
	  [ -e lab/$$(basename $$nb) ] || cp $$nb lab/; done

# One run of configs/quickstart.yaml with the CLI (no notebook), in $(OUT)/cli/quickstart/: the
# command line's folder of results, which git ignores.
train-quickstart: setup
	$(VENV)/bin/lbsgd train -c configs/quickstart.yaml out_dir=$(OUT)/cli resume=true

bench: setup
	$(VENV)/bin/lbsgd bench train --steps 300 --repeats 6 channels_last=true --out results/benchmarks/train_cpu.json
	$(VENV)/bin/lbsgd bench recipes --samples 6400 --repeats 4 channels_last=true --out results/benchmarks/recipes_cpu.json
	$(VENV)/bin/lbsgd bench ghost-bn --steps 30 --repeats 5 channels_last=true --out results/benchmarks/ghost_bn_cpu.json
	$(VENV)/bin/lbsgd bench ghost-bn --steps 30 --repeats 1 channels_last=true compile=true --out results/benchmarks/ghost_bn_compiled_cpu.json
	$(MAKE) bench-noise
	$(MAKE) bench-comm
	$(MAKE) bench-caps

# What cpu_isa=portable costs against avx2: the committed cpu profile's k = 16 run (warmup study,
# gradual, seed 0) for half an epoch under each cap, each run a fresh process, alternating 3 times;
# written to results/benchmarks/caps_cpu.json (docs/portability.md).
CAPS_RUN := $(firstword $(wildcard results/cpu/warmup/resnet8-synthetic-b256-gradual-s0-*/config.yaml))
bench-caps: setup
	$(VENV)/bin/lbsgd bench caps --caps avx2,portable --repeats 3 -c $(CAPS_RUN) epochs=0.5 --out results/benchmarks/caps_cpu.json

# What noise_scale=true costs: the trainer's step time with it over without it, alternating, in 3
# layouts of batch 128 = 4 micro-batches of 32 (1 process with B_small = 32 and = 64, 2 gloo
# processes with B_small = 64, the DDP hook alone), written to results/benchmarks/noise_scale_cpu.json;
# on a GPU node the same target measures the GPU (device=auto: noise_scale_cuda_h100.json, ...).
bench-noise: setup
	$(VENV)/bin/lbsgd bench noise --steps 100 --repeats 9 channels_last=true

# The trainer against the bare loop on a GPU (one process, device=cuda): ResNet-50 on random
# ImageNet-shaped images (dataset=fake, 3x224x224, 1000 classes, resident on the GPU), channels_last,
# micro-batch 256; layouts plain BN (bn_batch 256), ghost BN (bn_batch 32) and 4 accumulated
# micro-batches, each eager and compiled (compilation reported apart as warm-up). Written to
# results/benchmarks/train_<gpu>.json (e.g. train_cuda_h100.json). All precisions:
# make bench-gpu BENCH_PRECISIONS=fp32,bf16,fp16
BENCH_PRECISIONS ?= bf16
bench-gpu: setup
	$(VENV)/bin/lbsgd bench train --matrix --precisions $(BENCH_PRECISIONS) --compile false,true --layouts plain,ghost_bn,accum --accum 4 --steps 50 --repeats 2 device=cuda model=resnet50 dataset=fake precision=bf16 channels_last=true micro_batch=256 bn_batch=32 batch_size=256 threads=0

# All-reduce vs message size (flat and hierarchical, 2 nodes x 2 processes) and the step breakdown
# of 1, 2, 4 gloo processes for every comm_hook and two bucket sizes; notebook 10 reads both.
bench-comm: setup
	$(VENV)/bin/lbsgd bench allreduce --nproc 4 --nodes 2 --max-bytes 268435456 --iters 10 --out results/benchmarks/allreduce_cpu.json
	$(VENV)/bin/lbsgd bench train --nproc 1,2,4 --comm-hooks none,fp16,bf16,powersgd,hierarchical,parameter_server --bucket-caps 1,25 --steps 40 channels_last=true --out results/benchmarks/steps_cpu.json

# What a GPU node that keeps its own torch lacks, as wheels in .whl/ for a node without network
# (tools/gpu-check.sh setup installs them): pydantic and its parts, and setuptools to build lbsgd.
# WHEEL_PYTHON: the node's Python version (3.12 for a recent CUDA image).
WHEEL_PYTHON ?= 3.12
wheels: setup
	$(PY) -m pip download --quiet --dest .whl --only-binary=:all: --python-version $(WHEEL_PYTHON) \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -c constraints.txt pydantic pydantic_core annotated-types typing-inspection typing_extensions \
	  'setuptools>=77'
	@ls .whl

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
