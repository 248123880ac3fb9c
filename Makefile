# raybus — set-up, demo, tests. Every target installs into .venv first.
# Ray listens on loopback only and sends no usage stats.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0
# Python writes bytecode caches again where the environment says not to (these machines set
# PYTHONDONTWRITEBYTECODE=1). raybus is installed editable, so pip compiled none of it: every
# Ray worker process compiled raybus's modules from source, about 70 ms of the 0.8-1.0 s of
# CPU that starting one actor costs here, and the test suite starts about 950 (measured).
unexport PYTHONDONTWRITEBYTECODE

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test unit lint bench bench-full fault soak slow clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) examples/quickstart.py

lint: install
	$(VENV)/bin/ruff check raybus tests examples benchmarks
	$(VENV)/bin/mypy

# Two test processes, each with its own local Ray (tests/integration/conftest.py), whole files
# to one process (module-scoped namespaces stay shared): the suite waits on actors and timers
# more than it computes, so on two cores this takes ~60 % of the time of one process.
test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15

unit: install
	$(PY) -m pytest -q tests/unit

# tests/fault, then the integration tests marked fault (crashes and storage faults of the
# features those files test; each run has its own Ray cluster, so two runs).
fault: install
	$(PY) -m pytest -q -m fault tests/fault
	$(PY) -m pytest -q -m fault tests/integration

soak: install
	$(PY) -m pytest -q -m soak tests/fault

slow: install
	$(PY) -m pytest -q -m slow tests/integration

# raybus against RabbitMQ (quorum queues), ray.util.queue and bare Ray actors, in one run;
# regenerates benchmarks/RESULTS.md. RabbitMQ needs root (benchmarks/rabbitmq.sh installs and
# starts it on 127.0.0.1); without it the other systems still run and the tables say so.
bench: install
	$(PY) benchmarks/suite.py --quick --publish

bench-full: install
	$(PY) benchmarks/suite.py --publish

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
