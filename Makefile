# kube-device-exporter — every entry point a developer or CI needs; `make help` prints the
# `##` lines below.
## make demo       run the exporter against the simulated node and print where to look, and
##                 the doctor command that reads the same node (installs only what running
##                 needs: the package, and the simulator with nvml.h for its simulated driver)
## make install    the .venv with everything the tests need (make test does it first)
## make test       install everything it needs, lint, type-check and run the whole suite
## make test-fast  only the tests that start no process and wait out no timeout or back-off
##                 (markers `peer` and `slow`: tests/support/tiers.py), in under a minute
## make lint       ruff check and ruff format --check
## make typecheck  mypy (strict)
## make pytest     the whole pytest suite alone (PYTEST_ARGS=... for more)
## make realnode   only the real-kubelet tier (tests/test_real_kubelet*.py; README)
## make realcluster  only the real-cluster tier (tests/test_real_cluster*.py; docs/testing.md)
## make docs       regenerate docs/metrics.md, README's flag table, docs/nvml.md, measured figures
## make monitoring  regenerate dashboards/, deploy/grafana, deploy/alerts, deploy/prometheusrule,
##                 docs/dashboards.md, docs/alerts.md and docs/runbooks.md (the Helm chart's
##                 files/ are links to dashboards/ and deploy/alerts)
## make image IMAGE=registry.example.com/kube-device-exporter:0.1.0
##                 build the image (PYTHON_IMAGE=...: another base; docs/deploy.md)
## make push       the same, pushed
## make base-image  a Python base made here with debootstrap, for a build where no registry
##                 answers: then make image PYTHON_IMAGE=kube-device-exporter-base:bookworm
## make image-test  build the image and run it as the DaemonSet does (Docker; in make test too)
## make lock       regenerate requirements/*.lock (pip-compile, hashes) from pyproject.toml
## make bench      the benchmarks (docs/performance.md)
## make faults     fault and load runs against real exporter processes (about 4 minutes)
## make soak       the same, long (about 15 minutes): the figures in docs/reliability.md
## make proto      regenerate exporter/_proto from proto/
## make debs       the Debian packages the peer tests need (as root)
## make k8s        unpack the Kubernetes binaries of ../shared/k8s into .venv/k8s
## make fakenvml   build the simulated NVML library
## make clean      remove the environments, builds and caches
## make help       this list
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
# setuptools prints a banner on every editable install; it says nothing to us.
PIP := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q --disable-pip-version-check
DEBS := prometheus chromium
# The real-node tiers' peers (tests/realnode): Debian's containerd and runc, a static
# busybox for the workload image, gcc for the static pause, the CNI plugins.
NODE_DEBS := containerd runc busybox-static containernetworking-plugins gcc
# The image test (tests/test_image.py): Debian's Docker engine, and debootstrap for a
# stand-in base where no registry is reachable.
IMAGE_DEBS := docker.io debootstrap
# Kubernetes binaries for the real-node tiers: unpacked from K8S_SHARED (checked against
# its SHA256SUMS) into K8S; `make pytest` points KDE_E2E_* at them when they are there.
K8S_SHARED ?= ../shared/k8s
K8S := $(VENV)/k8s
# Absolute: the kubelet is started through nsenter, from another working directory.
E2E_ENV = KDE_E2E_KUBELET="$${KDE_E2E_KUBELET:-$$(ls $(CURDIR)/$(K8S)/kubelet-v* 2>/dev/null | head -n1)}" \
	KDE_E2E_HYPERKUBE="$${KDE_E2E_HYPERKUBE:-$$(ls $(CURDIR)/$(K8S)/hyperkube-v* 2>/dev/null | head -n1)}" \
	KDE_E2E_ETCD="$${KDE_E2E_ETCD:-$$(ls $(CURDIR)/$(K8S)/etcd-v* 2>/dev/null | head -n1)}"
LOCKS := requirements
LOCKVENV := .venv-lock
PIP_TOOLS := pip-tools==7.6.2
# PyPI and nothing else, whatever this machine's pip configuration adds.
LOCKENV := PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= PIP_INDEX_URL=https://pypi.org/simple
COMPILE := $(LOCKVENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links --resolver=backtracking
FAKENVML := simulator/fakenvml
DEMO_ADDR ?= 127.0.0.1:9405
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The image the chart (image.repository/tag) and the kit (kustomize images:) must name.
IMAGE ?= kube-device-exporter:$(VERSION)

.PHONY: lock image-test install demo test test-fast lint typecheck pytest realnode realcluster k8s bench faults soak proto docs debs fakenvml monitoring image push base-image clean help

install: $(STAMP) debs fakenvml k8s

# Every dependency comes from requirements/*.lock (pinned, with hashes; `make lock` writes
# them); only the project itself is installed beside them, without resolving anything. The
# simulated node is a distribution of its own (simulator/pyproject.toml: `kde-simulate`),
# installed editable beside the product, so the product's wheel carries none of it.
$(RUNTIME): pyproject.toml simulator/pyproject.toml $(LOCKS)/demo.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --require-hashes --no-deps -r $(LOCKS)/demo.lock
	$(PIP) --no-deps -e . -e ./simulator
	touch $(RUNTIME)

$(STAMP): $(RUNTIME) $(LOCKS)/test.lock
	$(PIP) --require-hashes --no-deps -r $(LOCKS)/test.lock
	touch $(STAMP)

# The locks, from PyPI alone (no local pip configuration), by pip-tools' pip-compile:
# test.lock (package + test extras) first; demo.lock (package + the simulator's simulator.in) and the image's
# runtime.lock (package only) start from its pins, so the three agree on every version they
# share (tests/test_lock.py checks). build.lock: what builds the wheel in the image.
# `make lock UPGRADE=1` moves every pin to the newest release the constraints allow.
lock:
	test -x $(LOCKVENV)/bin/pip-compile || { $(PYTHON) -m venv $(LOCKVENV) && \
	  $(LOCKENV) $(LOCKVENV)/bin/pip install -q $(PIP_TOOLS); }
	$(LOCKENV) $(COMPILE) $(if $(UPGRADE),--upgrade) --extra test -o $(LOCKS)/test.lock pyproject.toml
	cp $(LOCKS)/test.lock $(LOCKS)/demo.lock
	$(LOCKENV) $(COMPILE) -o $(LOCKS)/demo.lock pyproject.toml $(LOCKS)/simulator.in
	cp $(LOCKS)/test.lock $(LOCKS)/runtime.lock
	$(LOCKENV) $(COMPILE) -o $(LOCKS)/runtime.lock pyproject.toml
	$(LOCKENV) $(COMPILE) $(if $(UPGRADE),--upgrade) -o $(LOCKS)/build.lock $(LOCKS)/build.in

# Real peers for the suite (Prometheus + promtool, headless Chromium): Debian packages,
# installed when we are root and they are missing.
debs:
	@missing=""; command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	for pkg in $(NODE_DEBS) $(IMAGE_DEBS); do \
	  dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "not root: install$$missing yourself for the peer tests"; fi; \
	fi

# Each K8S_SHARED/NAME.xz is unpacked to K8S/NAME once; both the archive and the binary
# must match SHA256SUMS. Without K8S_SHARED the real-node tiers skip (README).
k8s:
	@if [ -f $(K8S_SHARED)/SHA256SUMS ]; then \
	  mkdir -p $(K8S); \
	  for xz in $(K8S_SHARED)/*.xz; do \
	    name=$$(basename $$xz .xz); \
	    want=$$(awk -v n=$$name '$$2 == n {print $$1}' $(K8S_SHARED)/SHA256SUMS); \
	    packed=$$(awk -v n=$$name.xz '$$2 == n {print $$1}' $(K8S_SHARED)/SHA256SUMS); \
	    if [ -z "$$want" ] || [ -z "$$packed" ]; then echo "k8s: $$name is not in SHA256SUMS" >&2; exit 1; fi; \
	    if [ -x $(K8S)/$$name ] && [ "$$(sha256sum < $(K8S)/$$name | cut -d' ' -f1)" = "$$want" ]; then continue; fi; \
	    [ "$$(sha256sum < $$xz | cut -d' ' -f1)" = "$$packed" ] || { echo "k8s: $$xz does not match SHA256SUMS" >&2; exit 1; }; \
	    echo "unpacking $$xz"; \
	    xz -dc $$xz > $(K8S)/$$name.part && chmod +x $(K8S)/$$name.part; \
	    [ "$$(sha256sum < $(K8S)/$$name.part | cut -d' ' -f1)" = "$$want" ] || { echo "k8s: $$name does not match SHA256SUMS" >&2; exit 1; }; \
	    mv $(K8S)/$$name.part $(K8S)/$$name; \
	  done; \
	fi

fakenvml: $(RUNTIME)
	@if [ -f $(FAKENVML)/Makefile ]; then $(MAKE) -s -C $(FAKENVML) PYTHON=$(CURDIR)/$(PY); fi

# The demo runs Python as the image does (Dockerfile ENV PYTHONMALLOC, exporter/runtime/heap.py).
demo: $(RUNTIME) fakenvml
	@PYTHONMALLOC=malloc $(VENV)/bin/kde-simulate demo --web.listen-address $(DEMO_ADDR) \
		|| { rc=$$?; echo "make demo: exit $$rc; if $(DEMO_ADDR) is in use, pick another port: make demo DEMO_ADDR=127.0.0.1:9505" >&2; exit $$rc; }

lint: $(STAMP)
	$(VENV)/bin/ruff check exporter simulator tests bench monitoring
	$(VENV)/bin/ruff format --check exporter simulator tests bench monitoring

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Two workers (pytest-xdist; CI has two cores): the tiers that start a kubelet, a cluster or
# a Docker engine run in one of them, one after the other (tests/conftest.py). `-n 0` in
# PYTEST_ARGS runs everything in this process.
XDIST := -n 2

pytest: install
	$(E2E_ENV) $(VENV)/bin/pytest -q $(XDIST) $(PYTEST_ARGS)

realnode: install
	$(E2E_ENV) $(VENV)/bin/pytest -q tests/test_real_kubelet*.py $(PYTEST_ARGS)

realcluster: install
	$(E2E_ENV) $(VENV)/bin/pytest -q tests/test_real_cluster*.py $(PYTEST_ARGS)

test: install lint typecheck pytest

# No lint, no type check, no peer: the loop to run after each edit. pytest's exit status 5
# (nothing selected) fails it like any other.
test-fast: $(STAMP) fakenvml
	$(VENV)/bin/pytest -q $(XDIST) -m "not peer and not slow" $(PYTEST_ARGS)

monitoring: $(STAMP)
	$(PY) -m monitoring

# Needs a Docker engine with BuildKit. The labels name this checkout's commit; SOURCE is
# where it can be fetched (the repository's URL). PIP_CA: a CA bundle for pip behind a
# TLS-intercepting proxy, handed to the build as a secret (never in a layer). PYTHON_IMAGE:
# the base from your own mirror (keep the digest: docs/deploy.md, "Build the image").
SOURCE ?= $(shell git remote get-url origin 2>/dev/null || echo unknown)
PIP_CA ?= $(wildcard $(PIP_CERT))
# Debian's docker.io client where there is one: it has BuildKit built in (newer clients
# want the buildx plugin for it).
DOCKER ?= $(firstword $(wildcard /usr/bin/docker) docker)
comma := ,
image:
	DOCKER_BUILDKIT=1 $(DOCKER) build -t $(IMAGE) \
	  --build-arg VERSION=$(VERSION) \
	  --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  --build-arg SOURCE=$(SOURCE) \
	  $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
	  $(if $(PIP_CA),--secret id=pip-ca$(comma)src=$(PIP_CA)) .

# Where no registry answers (an air-gapped build host): Debian bookworm's python3 (3.11) by
# debootstrap, as root, imported as LOCAL_BASE; build on it with
# `make image PYTHON_IMAGE=$(LOCAL_BASE)`. A local import has no registry digest: it is named
# by its tag alone. The recipe is tests/image/base.py's stand-in (the same packages, checked by
# tests/test_first_hour.py), on which make image-test builds and runs the image.
LOCAL_BASE ?= kube-device-exporter-base:bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
BASE_PACKAGES := python3,python3-venv,python-is-python3,ca-certificates
base-image:
	@command -v debootstrap >/dev/null || { echo "base-image: needs Debian's debootstrap (apt-get install debootstrap), as root" >&2; exit 1; }
	root=$$(mktemp -d) && trap 'rm -rf "$$root"' EXIT && \
	  debootstrap --variant=minbase --include=$(BASE_PACKAGES) bookworm "$$root" $(DEBIAN_MIRROR) && \
	  rm -rf "$$root"/var/cache/apt/archives "$$root"/var/lib/apt/lists "$$root"/usr/share/doc "$$root"/usr/share/man && \
	  tar --numeric-owner -C "$$root" -c . | $(DOCKER) import \
	    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - $(LOCAL_BASE)
	@echo "built $(LOCAL_BASE); now: make image PYTHON_IMAGE=$(LOCAL_BASE) IMAGE=..."

# Only the image test: build, run as the DaemonSet against the simulated node, rebuild.
image-test: install
	$(VENV)/bin/pytest -q tests/test_image.py $(PYTEST_ARGS)

push: image
	$(DOCKER) push $(IMAGE)

bench: install
	$(PY) -m bench

faults: install
	$(PY) -m bench.faults

soak: install
	$(PY) -m bench.faults --soak

docs: $(STAMP)
	$(PY) -m monitoring.metricdoc > docs/metrics.md
	$(PY) -m monitoring.flagdoc README.md
	$(PY) -m simulator.nvml_stand_in docs/nvml.md
	$(PY) -m bench.measured

proto: $(STAMP)
	PYTHON=$(CURDIR)/$(PY) proto/generate.sh

help:
	@sed -n 's/^## \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

clean:
	rm -rf $(VENV) $(LOCKVENV) build *.egg-info simulator/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	@if [ -f $(FAKENVML)/Makefile ]; then $(MAKE) -s -C $(FAKENVML) clean; fi
