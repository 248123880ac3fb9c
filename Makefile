# raybus — set-up, demo, tests. Every target installs into .venv first.
# Ray listens on loopback only and sends no usage stats.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test unit lint bench fault soak clean

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

test: lint
	$(PY) -m pytest -q

unit: install
	$(PY) -m pytest -q tests/unit

fault: install
	$(PY) -m pytest -q -m fault tests/fault

soak: install
	$(PY) -m pytest -q -m soak tests/fault

bench: install
	$(PY) benchmarks/core_throughput.py
	$(PY) benchmarks/durability.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
