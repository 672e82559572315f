# make install | run | test | test-fast | test-slurm | lint | lock  (optional: DATA=dir FID_WEIGHTS=file)
# WORKERS     pytest-xdist workers of make test and test-fast (default auto: one per CPU)
#
# LOCK        pip constraints with the exact versions CI checked (default envs/requirements.lock);
#             LOCK= installs pyproject.toml's open ranges instead. `make lock` refreshes the file.
# DATA        folder with MNIST/raw/*.gz and FashionMNIST/raw/*.gz (copied, never downloaded)
# FID_WEIGHTS pt_inception-2015-12-05-6726825d.pth for pytorch-fid
# Unset, the data and the FID weights are downloaded (needs internet).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV := .venv
PYTHON ?= python3
DATA ?=
LOCK ?= envs/requirements.lock
FID_WEIGHTS ?=

# Everything runs inside the project's venv.
IN_VENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)"
# data_mirror and fid_weights are set from DATA and FID_WEIGHTS (see README for other overrides).
OVERRIDES := $(if $(DATA),data_mirror=$(abspath $(DATA))) \
	$(if $(FID_WEIGHTS),fid_weights=$(abspath $(FID_WEIGHTS)))
SNAKEMAKE_CONFIG := $(if $(strip $(OVERRIDES)),--config $(strip $(OVERRIDES)))
TEST_ENV := $(if $(DATA),DPSINKHORN_DATA_MIRROR=$(abspath $(DATA))) \
	$(if $(FID_WEIGHTS),DPSINKHORN_FID_WEIGHTS=$(abspath $(FID_WEIGHTS)))

.PHONY: install run test test-fast test-slurm lint lock

install: $(VENV)/.installed

# Reinstall only when pyproject.toml or the lock is newer than the last install.
$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install $(if $(LOCK),-c $(LOCK)) -e '.[dev]'
	touch $@

# Rewrite envs/requirements.lock from pyproject.toml's ranges (a throwaway venv; needs PyPI).
lock:
	PYTHON=$(PYTHON) envs/lock.sh

# The quick configuration (MNIST, 2-core CPU; its time: README, "Two commands"): results/quick/tables/table1.md
run: install
	$(IN_VENV) snakemake --profile profiles/default --configfile config/quick.yaml \
		$(SNAKEMAKE_CONFIG)

# Lint, format check, unit tests, then the smoke workflow (tests/test_workflow.py, slow).
# Each test has a time limit (pyproject.toml, tests/conftest.py); the 25 slowest are listed.
# pytest-xdist: one worker per CPU (WORKERS), each test file on one worker (its
# module-scoped fixtures, e.g. the smoke workflow, run once), files in collection order
# (tests/conftest.py FIRST_FILES: the longest start first).
# One thread per test process (OMP_NUM_THREADS=1): the workers already use the CPUs, and
# threads that outnumber the cores only spin; a workflow's jobs still get their rule's
# threads from Snakemake.
WORKERS ?= auto
PARALLEL := -n $(WORKERS) --dist loadfile --no-loadscope-reorder
TEST_THREADS := OMP_NUM_THREADS=1
test: install
	$(IN_VENV) ruff check src tests
	$(IN_VENV) ruff format --check src tests
	$(IN_VENV) $(TEST_ENV) $(TEST_THREADS) pytest $(PARALLEL) --durations=25

# The workflow through profiles/slurm on a live one-node SLURM cluster started here
# (tests/slurm/run_live_cluster.sh; root: installs slurm-wlm and munge; ~10 min).
test-slurm: install
	$(IN_VENV) $(TEST_ENV) tests/slurm/run_live_cluster.sh

# Everything but the tests marked slow (docs/TESTING.md: what it covers; < 5 min).
test-fast: install
	$(IN_VENV) ruff check src tests
	$(IN_VENV) $(TEST_ENV) $(TEST_THREADS) pytest $(PARALLEL) -m "not slow" --durations=10

# Snakemake's linter over Snakefile and workflow/rules (.ci/run runs it after `make test`).
lint: install
	$(IN_VENV) snakemake --lint
