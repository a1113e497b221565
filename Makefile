# Two entry points, each doing its own set-up on a fresh machine:
#   make demo   - a local 4-proc mesh showing the API, then notebooks/quickstart.ipynb run headless on
#                 the `mesh` kernel with its outputs printed (the main job)
#   make test   - the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the sidebar's build runs `jupyter labextension build` from the venv
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test test-core test-ui test-cluster bench lint setup clean chromium cluster screenshots

$(STAMP): pyproject.toml package.json package-lock.json
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel of torch first (on disk here), so nothing pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	# build deps first, then an editable install without build isolation (~20 s instead of ~70 s);
	# the build runs npm (package-lock.json) and prebuilds the JupyterLab sidebar into the install
	$(BIN)/pip install -q hatchling hatch-jupyter-builder editables 'jupyterlab>=4.2,<5'
	$(BIN)/pip install -q --no-build-isolation -e '.[test,dev,ucx]'
	$(BIN)/jupyter labextension list 2>&1 | grep -E 'jupyter-mesh .*enabled.*OK'
	touch $(STAMP)

setup: $(STAMP)

# browser tests drive Debian's Chromium (never a downloaded browser)
chromium:
	@command -v chromium >/dev/null || { apt-get update -q && \
		apt-get install -y -q -o DPkg::Lock::Timeout=300 chromium >/dev/null; }

# multi-host tests (tests/cluster) run a real SLURM over network-namespace hosts: Debian's slurm-wlm and
# munge; the tests start their own daemons from a temp dir (nothing in /etc/slurm, no system service used).
# nftables: a firewall inside one namespace host (a test's own table, gone with the namespace)
cluster:
	@{ command -v slurmctld && command -v nft; } >/dev/null || { apt-get update -q && \
		apt-get install -y -q -o DPkg::Lock::Timeout=300 slurm-wlm munge nftables >/dev/null; }

demo: $(STAMP)
	$(COMPILE)
	$(BIN)/python -m jupyter_mesh.demo
	$(BIN)/python -m jupyter_mesh.notebook.headless notebooks/quickstart.ipynb

# UCX for real over its tcp transport (no GPU, no InfiniBand here); blocking progress, no busy threads
UCX_TEST_ENV := UCX_TLS=tcp,self UCXPY_PROGRESS_MODE=blocking UCX_WARN_UNUSED_ENV_VARS=n

# the TypeScript (sidebar and widget) type-checked with tsconfig.json's strict options (~5 s); the
# packages come from package-lock.json (`make setup` installed them with the build, npm ci if gone)
TS_LINT := { test -d node_modules/typescript || npm ci --no-audit --no-fund; } && npm run --silent lint

# two pytest runs (the browser tests keep their own event loop); fails if either fails
# bytecode compiled once: with PYTHONDONTWRITEBYTECODE (set on CI machines) every agent, kernel and
# script the tests start would compile our modules again (~0.25 s CPU each); stale files are ignored
COMPILE := $(BIN)/python -m compileall -q jupyter_mesh

test: $(STAMP) chromium cluster
	$(COMPILE)
	$(BIN)/ruff check jupyter_mesh tests benchmarks
	$(BIN)/ruff format --check jupyter_mesh tests benchmarks
	$(BIN)/python -m mypy jupyter_mesh
	$(TS_LINT)
	$(UCX_TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider --durations=40 --ignore=tests/ui; core=$$?; \
	$(UCX_TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider tests/ui; ui=$$?; \
	test $$core -eq 0 -a $$ui -eq 0

test-core: $(STAMP) cluster
	$(COMPILE)
	$(UCX_TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider --ignore=tests/ui

# the multi-host tests alone (root; 4 namespace hosts and a local SLURM, set up in about a second)
test-cluster: $(STAMP) cluster
	$(UCX_TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -m cluster tests/cluster

test-ui: $(STAMP) chromium
	$(UCX_TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider tests/ui

# the README's pictures (docs/*.png), refreshed from the current UI by the browser tests
screenshots: $(STAMP) chromium
	PYTHON=$(BIN)/python sh docs/screenshots.sh

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_failures.py
	$(UCX_TEST_ENV) $(BIN)/python benchmarks/bench_dataplane.py
	$(UCX_TEST_ENV) $(BIN)/python benchmarks/bench_multihost.py
	$(BIN)/python benchmarks/bench_import.py
	$(BIN)/python benchmarks/bench_large_results.py
	$(BIN)/python benchmarks/bench_fork_memory.py

lint: $(STAMP)
	$(BIN)/python -m mypy jupyter_mesh
	$(BIN)/ruff check jupyter_mesh tests benchmarks
	$(BIN)/ruff format --check jupyter_mesh tests benchmarks
	$(TS_LINT)

clean:
	rm -rf $(VENV) build dist *.egg-info lib node_modules jupyter_mesh/labextension tsconfig.tsbuildinfo
