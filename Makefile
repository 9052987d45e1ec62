# Two commands set everything up: `make reproduce` (the main job) and `make test`.
# Both create and fill .venv first when needed (`make setup`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test lint format reproduce bench clean

setup: $(STAMP)

# constraints.txt pins the tested versions of everything (torch/torchvision included).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,notebooks]'
	touch $(STAMP)

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The embedded default run (configs/quickstart.yaml) into $(OUT)/quickstart/. A run already
# complete there is skipped; `make reproduce OUT=elsewhere` replays it from scratch.
OUT ?= results
reproduce: setup
	$(VENV)/bin/lbsgd train -c configs/quickstart.yaml out_dir=$(OUT) resume=true

bench: setup
	$(VENV)/bin/lbsgd bench train --steps 300 --repeats 6 channels_last=true --out results/benchmarks/train_cpu.json
	$(VENV)/bin/lbsgd bench recipes --samples 6400 --repeats 4 channels_last=true --out results/benchmarks/recipes_cpu.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
