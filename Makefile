# The two commands that matter: `make demo` and `make test` (see README).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PACKS  := provider_packs/cursor-emulator

.PHONY: bootstrap packs emulator-pack lock-packs qualify-cursor demo serve-demo demo-git docker-up docker-down base-image demo-docker worker-image lock-deps test test-k8s unit integration lint fmt bench clean

bootstrap:
	@./scripts/bootstrap.sh

# Rebuild pack archives deterministically from source (digests are pinned in pack.json).
packs: emulator-pack
	@./scripts/npm-packs.sh

emulator-pack: bootstrap
	@$(PY) $(PACKS)/build.py >/dev/null

# After editing the emulator's source: rebuild and re-pin (commit pack.json and lock/).
lock-packs: emulator-pack
	@$(VENV)/bin/acp-worker pack lock $(PACKS)/dist/cursor-emulator-linux.tar --pack cursor-emulator --platform any

# Real Cursor: full conformance turns with the locked `cursor` pack and CURSOR_API_KEY,
# `agent --version` recorded with the results (tests/conformance/results/); without the
# key it says it skipped. Lock the pack first: `.venv/bin/acp-worker pack lock cursor`.
qualify-cursor: bootstrap
	@./scripts/qualify-cursor.sh

# Progress on the terminal; the canonical events (JSON lines) into DEMO_EVENTS, named at the end.
DEMO_EVENTS ?= examples/out/hello.events.jsonl
demo: emulator-pack
	@mkdir -p "$(dir $(DEMO_EVENTS))"
	@$(VENV)/bin/acp-worker run examples/hello.json --events-out "$(DEMO_EVENTS)"
	@echo "demo: $$(wc -l < "$(DEMO_EVENTS)") canonical events in $(DEMO_EVENTS)"

# `acp-worker serve` for the example jobs (the README's tour): it runs from examples/, so the
# jobs' relative workspace paths resolve there as they do for `acp-worker run`; `file:`
# secrets come from examples/secrets (the emulator's dummy key); local workspaces are limited
# to examples/. Redis: ACPW_REDIS_URL if set, else the local default. Ctrl-C stops it.
serve-demo: emulator-pack
	@cd examples && \
	  ACPW_REDIS_URL="$${ACPW_REDIS_URL:-redis://127.0.0.1:6379/0}" \
	  ACPW_SECRETS_DIR="$(CURDIR)/examples/secrets" \
	  ACPW_LOCAL_WORKSPACE_ROOTS='["$(CURDIR)/examples"]' \
	  exec "$(abspath $(VENV))/bin/acp-worker" serve --concurrency 2

# A git workspace: makes a tiny repository, runs examples/git-change.json on a clone of it,
# prints the captured changes (workspace.changed + the patch) and `git apply`s the patch.
demo-git: emulator-pack
	@$(PY) examples/git_change.py

# The chart's tests run once, in `make chart`, not again in the suite; its run under
# podman kube play is `make chart-podman` (minutes on a fresh clone).
test: packs lint chart
	@$(PY) -m pytest -q -p no:cacheprovider --ignore=tests/unit/test_helm_chart.py \
	  --ignore=tests/integration/test_chart_podman.py $(PYTEST_ARGS)

# The kubernetes backend and the chart qualified on a real cluster (kind, k3s, a cloud
# cluster), in one command: scripts/test-k8s.sh installs the chart with `helm`, runs a job
# through it, then the backend's modules as the chart's ServiceAccount. KUBECONFIG names
# the cluster; ACPW_TEST_K8S_REGISTRY, ACPW_TEST_K8S_WORKER_IMAGE, ACPW_TEST_K8S_REDIS_URL
# are required (docs/kubernetes.md). Without KUBECONFIG it fails (exit 2) saying so: `make
# test` runs the backend's suite against the API double (tests/k8s_double), not a cluster.
test-k8s:
	@PY="$(PY)" ./scripts/test-k8s.sh $(PYTEST_ARGS)

# helm/acp-worker rendered by Helm's own engine (helm-python-sdk, no helm binary) for every
# value profile, linted, each manifest validated (Kubernetes 1.29/1.37 schemas, the CRD
# kinds against tests/unit/fixtures/crds/), bad values refused: ~15 s.
.PHONY: chart
chart: bootstrap
	@$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_helm_chart.py

# The daytona backend's live suite against a real account (tests/integration/test_daytona_live.py:
# stdio, the echo check, a repeated input call, snapshot reuse, read-only masks, links),
# then the double's suite. It needs DAYTONA_API_KEY, ACPW_DAYTONA_IMAGE_REGISTRY,
# ACPW_DAYTONA_BASE_IMAGE_ID and DAYTONA_TEST_CLOSURE (DAYTONA_API_URL optional;
# docs/daytona.md); without them it fails, naming what is missing: a live run asked for
# and not made is not a pass. `make test` runs the double's suite.
.PHONY: test-daytona
test-daytona: emulator-pack
	@missing=""; for v in DAYTONA_API_KEY ACPW_DAYTONA_IMAGE_REGISTRY ACPW_DAYTONA_BASE_IMAGE_ID DAYTONA_TEST_CLOSURE; do \
	  eval "[ -n \"\$$$$v\" ]" || missing="$$missing $$v"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "test-daytona: FAILED: the live Daytona suite needs$$missing (see docs/daytona.md; make test runs the double's suite)" >&2; \
	  exit 2; \
	fi
	@$(PY) -m pytest -q -p no:cacheprovider -rs tests/integration/test_daytona_live.py \
	  tests/integration/test_daytona_backend.py tests/integration/test_daytona_stdio.py \
	  tests/integration/test_warm_daytona.py $(PYTEST_ARGS)

# The one-node install run for real: the chart rendered (values-single-node.yaml, dev
# Redis), the worker image built (scripts/worker-image.sh) and both played with `podman
# kube play` on the Podman service; ready, then a job from the host settles succeeded in
# a docker sandbox (tests/integration/test_chart_podman.py; docs/helm.md). Fresh clone:
# ~4 min (wheels, base image, worker image); then ~1 min.
.PHONY: chart-podman
chart-podman: emulator-pack docker-up
	@$(PY) -m pytest -q -p no:cacheprovider -s tests/integration/test_chart_podman.py $(PYTEST_ARGS)

unit: bootstrap
	@$(PY) -m pytest -q tests/unit

lint: bootstrap
	@$(VENV)/bin/ruff check worker tasks tests benchmarks examples
	@$(VENV)/bin/ruff format --check worker tasks tests benchmarks examples
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports --no-cache >/dev/null || $(VENV)/bin/lint-imports --no-cache

fmt: bootstrap
	@$(VENV)/bin/ruff format worker tasks tests benchmarks examples
	@$(VENV)/bin/ruff check --fix worker tasks tests benchmarks

# The docker backend, against Podman's Docker API (started on demand, stopped by docker-down).
DOCKER_HOST_SOCK := unix:///var/tmp/acpw-podman/run/podman.sock
docker-up:
	@./scripts/podman-service.sh start >/dev/null
docker-down:
	@./scripts/podman-service.sh stop

# One-time per machine: mmdebstrap rootfs (~55 s) + base image build (~15 s), then cached.
base-image: bootstrap docker-up
	@DOCKER_HOST=$(DOCKER_HOST_SOCK) $(VENV)/bin/acp-worker image base

demo-docker: emulator-pack base-image
	@DOCKER_HOST=$(DOCKER_HOST_SOCK) $(VENV)/bin/acp-worker image build cursor-emulator
	@DOCKER_HOST=$(DOCKER_HOST_SOCK) $(VENV)/bin/acp-worker run examples/hello.json --backend docker

# The worker's own image (Dockerfile), offline: wheels and .debs on the host (cached), then
# podman build FROM the local base image by id (BASE=<image>@sha256:… to override). Prints
# the image id and how long it took: ~35 s cold here (wheels 7 s, build 26 s; plus the base
# image once, ~70 s), ~10–15 s warm (every layer cached but the acp-worker wheel's).
worker-image: bootstrap
	@./scripts/worker-image.sh

# Re-pin the worker image's dependencies with hashes after changing pyproject.toml
# (LOCK_ARGS=--upgrade to move every pin to the newest allowed version).
lock-deps: bootstrap
	@$(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links $(LOCK_ARGS) \
	  --extra celery --extra daytona --extra docker --extra kubernetes --extra s3 \
	  --output-file requirements.lock pyproject.toml requirements-image.in

# Every benchmark, each to its end, then one table of figure, target and verdict (each
# script prints a BENCH-SUMMARY line; benchmarks/_run.py collects them; a target not met is
# a verdict, a script that ends without its line fails the target). They need the packs
# (and, through bootstrap, the local Redis: event_throughput, job_overhead, drain and
# serve_start flush its databases 12 and 11); container_start and image_reuse need the
# Podman service and the base image; workspace and workspace_disk need root (loop devices).
# Not run: compare_revisions.py (a tool: two revisions, --base REV, see docs/figures.md)
# and workloads.py (its callgrind workloads). ACPW_BENCH_QUICK=1 runs every one at a tiny
# size (figures meaningless; `make test` does so for the fast ones, tests/integration/
# test_bench_target.py), ACPW_BENCH_DRY=1 only checks that each starts.
BENCH_SKIP := benchmarks/compare_revisions.py benchmarks/workloads.py
BENCHES    := $(filter-out $(BENCH_SKIP) benchmarks/_%,$(sort $(wildcard benchmarks/*.py)))

bench: packs base-image
	@DOCKER_HOST=$(DOCKER_HOST_SOCK) $(PY) benchmarks/_run.py $(BENCHES)

# The scripts `make bench` runs, one line (tests/integration/test_bench_target.py reads it).
.PHONY: bench-list
bench-list:
	@echo $(BENCHES)

clean:
	rm -rf $(VENV) build provider_packs/*/dist
