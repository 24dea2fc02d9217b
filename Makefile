# The front door. `make demo` and `make test` each set everything up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: dev demo run test lint typecheck pytest proto bench chaos clean help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

dev: $(STAMP) ## create .venv with the package and every dev tool

demo: $(STAMP) ## run the agent's embedded default: a simulated kubelet and its snapshot
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

bench: $(STAMP) ## measure the speed claims side by side and write BENCHMARKS.md (~25 min; bench/run.py --only NAME for one section)
	$(BIN)/python bench/run.py

proto: $(STAMP) ## regenerate watcher/kubeletapi from proto/
	$(BIN)/python proto/generate.py

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
