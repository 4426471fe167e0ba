# bucketlearn — every target works from a fresh clone; `make install` is implied.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install demo down test test-domain test-unit test-integration test-e2e test-infra lint bench clean \
        checkov fmt-infra deploy teardown browser
CHECKOV_STAMP := .venv-checkov/.installed-stamp

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

# checkov lives in its own venv: it pins packaging<24 and ships a conflicting `hcl2` module.
checkov: $(CHECKOV_STAMP)

$(CHECKOV_STAMP): tests/infra/install_checkov.sh
	tests/infra/install_checkov.sh $(PYTHON)
	touch $(CHECKOV_STAMP)

# The dashboard's browser test drives Debian's chromium with its chromedriver; the infra tests
# run shellcheck over infra/*.sh.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v shellcheck >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq chromium chromium-driver shellcheck; } || \
	  echo "could not install chromium, chromium-driver, shellcheck (needs apt and root); their tests will skip"

# Two pytest workers (pytest-xdist), a test file each at a time: the end-to-end files spend most
# of their time waiting on the stack (leases, deadlines, polls), and a file keeps its
# module-scoped stack and artifacts on one worker. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: install checkov browser
	$(PY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-infra: install checkov
	$(PY) -m pytest -q tests/infra $(PYTEST_ARGS)

fmt-infra:
	terraform fmt -check -recursive infra

deploy:
	infra/deploy.sh --project $(PROJECT)

teardown:
	infra/teardown.sh

test-domain: install
	$(PY) -m pytest -q tests/domain $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -q tests/domain tests/unit $(PYTEST_ARGS)

test-integration: install
	$(PY) -m pytest -q tests/integration $(PYTEST_ARGS)

test-e2e: install
	$(PY) -m pytest -q tests/e2e $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# Full benchmarks (minutes on 2 cores; run on an idle machine). BENCH_ARGS, e.g. "--only ingest".
BENCH_ARGS ?=
bench: install
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-checkov .bucketlearn .pytest_cache .ruff_cache
