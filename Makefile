# The two commands of the README: `make demo` runs the system, `make test` passes the tests.
# Both need only Python 3.11, pip and make: they create .venv and install what they need.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
INSTALLED := $(VENV)/.installed
# pytest processes for `make test` (pytest-xdist); files are handed out whole (--dist loadfile),
# so that a module's live stack or other module-scoped fixture is started once, longest first
# (tests/durations.json, tests/conftest.py; refresh it with INTUNE_TEST_DURATIONS=tests/durations.json
# make test). soak stays serial.
# Two on any host: most tests wait on child processes and live stacks (TEST_WORKERS=1: serial).
TEST_WORKERS ?= 2

.PHONY: demo test soak bench lint format clean help

help:
	@echo "make demo    run the control plane, a Celery worker and a demo agent on http://127.0.0.1:8000"
	@echo "make test    install everything and run the test suite (TEST_WORKERS=2: two pytest processes)"
	@echo "make soak    the long reliability and load runs (docs/reliability.md)"
	@echo "make bench   the pipeline and tuner benchmarks (docs/benchmarks.md)"
	@echo "make lint    ruff"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when pyproject.toml changes.
$(INSTALLED): pyproject.toml | $(PY)
	$(PIP) install --quiet --disable-pip-version-check --upgrade pip
	$(PIP) install --quiet --disable-pip-version-check -e ".[test]"
	touch $@

demo: $(INSTALLED)
	$(PY) -m webapp.stack.demo

test: $(INSTALLED)
	bash scripts/ensure-test-tools
	$(PY) -m ruff check agents tuner webapp benchmarks tests
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

soak: $(INSTALLED)
	$(PY) -m pytest -m soak --run-soak $(PYTEST_ARGS)

bench: $(INSTALLED)
	$(PY) -m benchmarks.pipeline --quick
	$(PY) -m benchmarks.layout_twin
	$(PY) -m tuner.bench --suite tuner/suites/default.json --tuners intune,hillclimb,lp,static,random --steps 150 --seeds 3 --json var/bench-tuner.json

lint: $(INSTALLED)
	$(PY) -m ruff check agents tuner webapp benchmarks tests

format: $(INSTALLED)
	$(PY) -m ruff format agents tuner webapp benchmarks tests

clean:
	rm -rf var/logs var/staticfiles .pytest_cache
