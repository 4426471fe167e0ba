# bucketlearn — every target works from a fresh clone; `make install` is implied.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install demo down test test-unit test-integration test-e2e lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,dashboard]"
	touch $(STAMP)

demo: install
	$(VENV)/bin/bucketlearn demo

down: install
	$(VENV)/bin/bucketlearn local down

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test-integration: install
	$(PY) -m pytest -q tests/integration $(PYTEST_ARGS)

test-e2e: install
	$(PY) -m pytest -q tests/e2e $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check bucketlearn functions workers dashboard tests benchmarks data

bench: install
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) .bucketlearn .pytest_cache .ruff_cache
