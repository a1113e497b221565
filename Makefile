# Two entry points, each doing its own set-up on a fresh machine:
#   make demo   - a local 4-proc mesh showing the API, then notebooks/quickstart.ipynb run headless on
#                 the `mesh` kernel with its outputs printed (the main job)
#   make test   - the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint setup clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel of torch first (on disk here), so nothing pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,dev,ucx]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m jupyter_mesh.demo
	$(BIN)/python -m jupyter_mesh.notebook.headless notebooks/quickstart.ipynb

# UCX for real over its tcp transport (no GPU, no InfiniBand here); blocking progress, no busy threads
UCX_TEST_ENV := UCX_TLS=tcp,self UCXPY_PROGRESS_MODE=blocking UCX_WARN_UNUSED_ENV_VARS=n

test: $(STAMP)
	$(BIN)/ruff check jupyter_mesh tests benchmarks
	$(BIN)/ruff format --check jupyter_mesh tests benchmarks
	$(UCX_TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_failures.py
	$(UCX_TEST_ENV) $(BIN)/python benchmarks/bench_dataplane.py

lint: $(STAMP)
	$(BIN)/ruff check jupyter_mesh tests benchmarks
	$(BIN)/ruff format --check jupyter_mesh tests benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info
