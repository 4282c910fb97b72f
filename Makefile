# Tabby: `make demo` to see it work, `make test` to prove it.
SHELL := /bin/bash
PY := .venv/bin/python
PYTEST := $(PY) -m pytest
STAMP := .venv/.installed
export TABBY_CACHE_DIR ?= $(CURDIR)/.cache

.PHONY: all deps venv build images lint test test-unit test-integration test-nodes conformance soak demo demo-down clean

all: test

deps:
	hack/install-deps.sh

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The Kubernetes binaries, the upstream policy suites (e2e Netpol, cyclonus, ginkgo), and
# the node-side CNI executable (cni/forwarder, static Go).
build: deps
	hack/build-k8s.sh >/dev/null
	hack/build-e2e.sh >/dev/null
	hack/build-cni.sh >/dev/null

# The lab nodes' images (pause, agnhost, tabby), no Docker daemon: lab/images.py.
# `tabbyctl lab up` builds what is missing itself; this only does it ahead of time.
images: venv build
	hack/build-images.sh >/dev/null

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy

test-unit: venv
	$(PYTEST) tests/unit -q

test-integration: venv build
	$(PYTEST) tests/integration -q -m integration

# Only the real-node tier (kubelet, containerd, kube-proxy per node; Tabby from
# manifests/). `make test` runs it too.
test-nodes: venv images
	$(PYTEST) tests/integration/nodes -q

# The README's test command: installs what is missing, lints, then runs both tiers.
test: deps venv build images lint
	$(PYTEST) tests/unit tests/integration -q --durations=25

# The upstream suites on a fresh 3-node real-node lab: the e2e Netpol focus, the
# Services specs, cyclonus by pod IP and by Service IP; then the Services specs on a
# ptp + host-local lab for comparison. Writes docs/conformance.md and
# build/conformance/. POLICY=kube-network-policies: the reference implementation
# enforces instead of Tabby (docs/conformance-kube-network-policies.md).
POLICY ?= tabby
conformance: deps venv build images
	$(PY) -m lab.conformance --policy $(POLICY) $(CONFORMANCE_ARGS)

# Churn and faults on a 4-node lab for SOAK_MINUTES (default 15), a seeded schedule
# (SOAK_SEED, default random and printed): tests/soak/runner.py. Ends with one line
# `soak minutes=... duplicates=0 leaks=0 policy_violations=0 flows_lost=0`.
# LAB=namespaces (default) or LAB=nodes: kubelet, containerd and Tabby's manifests.
SOAK_MINUTES ?= 15
LAB ?= namespaces
soak: deps venv build $(if $(filter nodes,$(LAB)),images)
	$(PY) -m tests.soak.runner --lab $(LAB) --minutes $(SOAK_MINUTES) $(if $(SOAK_SEED),--seed $(SOAK_SEED))

# The README's first command: a 3-node lab with pods, BGP and a policy. `make demo-down` ends it.
demo: deps venv build images
	.venv/bin/tabbyctl lab down >/dev/null 2>&1 || true
	.venv/bin/tabbyctl lab up --nodes 3
	.venv/bin/tabbyctl lab demo

demo-down: venv
	.venv/bin/tabbyctl lab down

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache build *.egg-info
