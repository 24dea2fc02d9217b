# The front door. `make demo` and `make test` each set everything up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
# What `make demo` needs: the agent and its runtime dependencies, not the dev toolchain (the dev
# install includes them, so it stamps both).
RUN_STAMP := $(VENV)/.installed-run
PY_CHECK  := $(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (set PYTHON=...)")'

.PHONY: dev demo run test lint typecheck pytest proto bench chaos docs clean help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(RUN_STAMP): pyproject.toml
	@$(PY_CHECK)
	@echo "setting up $(VENV) with the agent's runtime dependencies (first run only)..."
	@test -x $(BIN)/python || { echo "  creating the virtualenv $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "  installing the agent and what it needs to run: grpcio, protobuf, aiohttp, structlog,"
	@echo "  prometheus-client, watchfiles, lightkube, nats-py (about half a minute; make test adds the dev tools)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	@echo "  $(VENV) is ready"
	@touch $@

$(STAMP): pyproject.toml
	@$(PY_CHECK)
	@echo "setting up $(VENV) with the agent and the dev toolchain: pytest, ruff, mypy, grpcio-tools (first run only)..."
	@test -x $(BIN)/python || { echo "  creating the virtualenv $(VENV)"; $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@echo "  $(VENV) is ready"
	@touch $@ $(RUN_STAMP)

dev: $(STAMP) ## create .venv with the package and every dev tool

demo: $(RUN_STAMP) ## watch a simulated kubelet through a scripted story (installs runtime dependencies only)
	$(BIN)/pod-resources-watcher demo

test: lint typecheck pytest ## everything CI runs: lint, type check, tests

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP) ## mypy --strict on the package
	$(BIN)/mypy

pytest: $(STAMP) ## the test suite
	$(BIN)/pytest

chaos: $(STAMP) ## the long reliability suites: 200 kubelet restarts, 50 warm-ups, 70 receiver flaps (see RELIABILITY.md)
	PRW_CHAOS_RESTARTS=200 PRW_CHAOS_FLAPS=70 PRW_WARMUP_RESTARTS=50 PRW_WARMUP_MAX_S=5 \
	PRW_CHAOS_REPORT=$${PRW_CHAOS_REPORT:-/dev/null} PRW_SINK_CHAOS_REPORT=$${PRW_SINK_CHAOS_REPORT:-/dev/null} \
	$(BIN)/pytest -p no:cacheprovider tests/test_chaos.py tests/test_sink_chaos.py \
	    tests/test_settling.py::test_restarts_with_warm_up_and_no_change_report_only_the_restarts

bench: $(STAMP) ## measure the speed claims side by side and write BENCHMARKS.md (~28 min; bench/run.py --only NAME for one section)
	$(BIN)/python bench/run.py

proto: $(STAMP) ## regenerate watcher/kubeletapi from proto/
	$(BIN)/python proto/generate.py

docs: $(STAMP) ## regenerate docs/configuration.md from the settings' doc strings
	$(BIN)/python -m testkit.config_reference > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
