# Stride developer commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
UV_VERSION := 0.13.9
STRIDE := $(VENV)/bin/stride
DEMO_STATE := $(CURDIR)/.stride-demo
# pytest prints its own summary; -p no:cacheprovider keeps the tree clean.
PYTEST_ARGS ?=
TEST_WORKERS ?= 4
# Tests run in three processes on the two cores (each test has its own NATS server and
# database, so they do not meet; most of a test's time is spent waiting on the services it
# started, and two processes left the cores idle half the time); the TensorFlow end-to-end
# tests run one after another on one of them (tests/conftest.py).
# A test process that dies (a crash, or stride.testing.watchdog ending a hung test) fails
# the run, naming the test: pytest-xdist 3.8's loadgroup scheduling hangs for good when it
# replaces a dead worker (pytest-dev/pytest-xdist#1323, #1327, #1378).

.DEFAULT_GOAL := help
.PHONY: help install system-deps kube-tools proto proto-check lint test test-unit fuzz chaos bench demo up down lock clean

help:  ## List the commands
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; Stride needs Python 3.11 (set PYTHON=...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --python $(PY) --quiet --compile-bytecode -c constraints.txt -e ".[all,dev]"
	touch $@

# Bytecode is compiled ahead (the dependencies at install, Stride's own sources, which are
# installed editable, at every make: only what changed): where PYTHONDONTWRITEBYTECODE is
# set, as on CI runners and in many images, Python writes no .pyc itself, and every process
# compiled every module it imports (a service started in 3 s instead of 1 s, TensorFlow's
# pods much slower). A file that does not compile is reported by the tests and ruff.
install: $(VENV)/.installed  ## Create .venv and install everything, pinned by constraints.txt
	@$(PY) -m compileall -q -j 0 libs services > /dev/null || true

system-deps:  ## OS tools: docker-compose (validates compose.yaml), nftables (make chaos's partitions); skipped when not root
	@if command -v docker-compose >/dev/null && command -v nft >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose nftables >/dev/null) \
	    || echo "note: docker-compose or nftables could not be installed; the compose check or chaos's partitions will not run"; \
	else echo "note: not root; install docker-compose and nftables for the compose check and chaos's partitions"; fi

kube-tools:  ## Build the tests' Kubernetes control plane (apiserver, controller-manager, scheduler, kine, kwok, helm) into .cache/kube/bin; only what is missing or re-pinned
	@tools/kube/build.sh

proto: install  ## Regenerate the protobuf and gRPC stubs from proto/
	$(PY) proto/generate.py

proto-check: install  ## Fail if the checked-in stubs differ from what proto/ generates
	$(PY) proto/generate.py --check

lint: install  ## ruff, mypy --strict, import contracts, buf lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	cd proto && ../$(VENV)/bin/buf lint

test: install system-deps  ## Unit, integration (real NATS and PostgreSQL, both started by the run) and end-to-end tests
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0 --durations=15 $(PYTEST_ARGS)

test-unit: install  ## Only the fast unit tests
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

fuzz: install  ## 10,000 generated requests per service against all eight running services; report in bench/results/fuzz.txt
	@set -o pipefail; { echo "$$ make fuzz  ($$(date -u +%FT%TZ))"; \
	STRIDE_FUZZ_CASES=10000 $(VENV)/bin/pytest tests/integration/test_grpc_bad_input.py \
	  -k "generated_requests or after_everything" -p no:cacheprovider -q --durations=5 2>&1; } \
	  | tee bench/results/fuzz.txt

chaos: install system-deps  ## A training job and 200 simulated jobs while every service, NATS and PostgreSQL is killed in turn and the job's pods and a service are cut off by the network; report in bench/results/chaos.txt
	$(PY) bench/chaos.py --load 200

bench: install  ## Run every benchmark; each prints its ratio to a reference and rewrites bench/results/
	@for script in bench/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

demo: install  ## A job that trains: submit, pods start, loss falls, the optimizer resizes it live (10 s metric windows), done
	@rm -rf $(DEMO_STATE); trap '$(STRIDE) down --state-dir $(DEMO_STATE)' EXIT; \
	set -e; S="--state-dir $(DEMO_STATE)"; export COLUMNS=$${COLUMNS:-140}; \
	export STRIDE_OPTIMIZER_TICK_SECONDS=$${STRIDE_OPTIMIZER_TICK_SECONDS:-10}; \
	export STRIDE_OPTIMIZER_MIN_PLAN_INTERVAL_SECONDS=$${STRIDE_OPTIMIZER_MIN_PLAN_INTERVAL_SECONDS:-10}; \
	$(STRIDE) up $$S; \
	echo; echo '$$ stride submit examples/wide-deep.yaml --wait'; \
	JOB=$$($(STRIDE) submit examples/wide-deep.yaml --wait $$S | tee /dev/stderr | awk '/^job-/ {print $$1; exit}'); \
	test -n "$$JOB" || { echo "error: no job id in the submit output"; exit 1; }; \
	echo; echo "waiting for $$JOB to train..."; \
	for i in $$(seq 90); do $(STRIDE) logs $$JOB $$JOB-chief-0 --tail 200 $$S 2>/dev/null | grep -q '"event": "steps"' && break; sleep 2; done; \
	echo; echo '$$ stride top --once'; $(STRIDE) top --once $$S; \
	echo; echo "waiting for the optimizer to change the plan after its first metric window..."; \
	for i in $$(seq 120); do $(STRIDE) plans $$JOB $$S 2>/dev/null | grep -q 'plan v2' && break; sleep 2; done; \
	echo; echo '$$ stride top --once'; $(STRIDE) top --once $$S; \
	echo; echo "$$ stride wait $$JOB"; $(STRIDE) wait $$JOB --timeout 900 $$S; \
	echo; echo "$$ stride logs $$JOB $$JOB-chief-0 | grep -E 'steps|reconfigured|finished'"; \
	$(STRIDE) logs $$JOB $$JOB-chief-0 --tail 5000 $$S > $(DEMO_STATE)/chief.log; \
	grep -E '"event": "steps"' $(DEMO_STATE)/chief.log | sed -n '1,2p'; \
	grep -E '"event": "(command|reconfigured|finished)"' $(DEMO_STATE)/chief.log; \
	echo; echo "$$ stride explain $$JOB   # every plan, and why it was chosen"; $(STRIDE) explain $$JOB $$S; \
	echo; echo '$$ stride submit examples/invalid-job.yaml   # refused on purpose'; \
	if $(STRIDE) submit examples/invalid-job.yaml $$S; then \
	  echo "error: the invalid job was accepted"; exit 1; fi

up: install  ## Start the suite in the background (embedded NATS and PostgreSQL 18 unless URLs are set)
	$(STRIDE) up

down: install  ## Stop the suite
	$(STRIDE) down

lock: install  ## Re-pin constraints.txt after changing dependencies in pyproject.toml
	$(VENV)/bin/uv pip compile pyproject.toml --all-extras --python-version 3.11 --no-header -o constraints.txt

clean:  ## Remove the virtualenv and local state
	rm -rf $(VENV) $(DEMO_STATE) .mypy_cache .ruff_cache
