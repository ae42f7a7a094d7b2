# kube-device-exporter — every entry point a developer or CI needs.
#   make demo    run the exporter against the simulated node and print where to look
#                (installs only what running needs: the package and nvml.h for the simulated driver)
#   make test    install everything it needs, lint, type-check and run the whole suite
#   make monitoring  regenerate dashboards/, deploy/grafana, deploy/alerts, deploy/prometheusrule,
#                    docs/alerts.md, docs/runbooks.md and the Helm chart's files/
#   make image IMAGE=registry.example.com/kube-device-exporter:0.1.0 (push: the same, pushed)
#   make faults  fault and load runs against real exporter processes (about 4 minutes)
#   make soak    the same, long (about 15 minutes): the figures in docs/reliability.md
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
# setuptools prints a banner on every editable install; it says nothing to us.
PIP := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q --disable-pip-version-check
DEBS := prometheus chromium
FAKENVML := exporter/simulate/fakenvml
DEMO_ADDR ?= 127.0.0.1:9400
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The image the chart (image.repository/tag) and the kit (kustomize images:) must name.
IMAGE ?= kube-device-exporter:$(VERSION)

.PHONY: install demo test lint typecheck pytest bench faults soak proto docs debs fakenvml monitoring image push clean

install: $(STAMP) debs fakenvml

$(RUNTIME): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[sim]'
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(PIP) -e '.[test]'
	touch $(STAMP)

# Real peers for the suite (Prometheus + promtool, headless Chromium): Debian packages,
# installed when we are root and they are missing.
debs:
	@missing=""; command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "not root: install$$missing yourself for the peer tests"; fi; \
	fi

fakenvml: $(RUNTIME)
	@if [ -f $(FAKENVML)/Makefile ]; then $(MAKE) -s -C $(FAKENVML) PYTHON=$(CURDIR)/$(PY); fi

# The demo runs Python as the image does (Dockerfile ENV PYTHONMALLOC, exporter/heap.py).
demo: $(RUNTIME) fakenvml
	PYTHONMALLOC=malloc $(VENV)/bin/kube-device-exporter simulate demo --web.listen-address $(DEMO_ADDR)

lint: $(STAMP)
	$(VENV)/bin/ruff check exporter tests bench monitoring
	$(VENV)/bin/ruff format --check exporter tests bench monitoring

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: install
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

test: install lint typecheck pytest

monitoring: $(STAMP)
	$(PY) -m monitoring

# Needs a Docker engine (or another builder behind the docker CLI); none runs in CI here.
image:
	docker build -t $(IMAGE) .

push: image
	docker push $(IMAGE)

bench: install
	$(PY) -m bench

faults: install
	$(PY) -m bench.faults

soak: install
	$(PY) -m bench.faults --soak

docs: $(STAMP)
	$(PY) -m exporter.metricdoc > docs/metrics.md
	$(PY) -m exporter.flagdoc README.md
	$(PY) -c 'from exporter.sources.nvml.behaviour import markdown; print(markdown(), end="")' > docs/nvml.md

proto: $(STAMP)
	PYTHON=$(CURDIR)/$(PY) proto/generate.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	@if [ -f $(FAKENVML)/Makefile ]; then $(MAKE) -s -C $(FAKENVML) clean; fi
