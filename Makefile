# kube-device-exporter — every entry point a developer or CI needs.
#   make demo    run the exporter against the simulated node and print where to look
#   make test    install everything it needs, lint, type-check and run the whole suite
#   make monitoring  regenerate dashboards/, deploy/grafana, deploy/alerts, deploy/prometheusrule
#   make faults  fault and load runs against real exporter processes (about 2 minutes)
#   make soak    the same, long (about 15 minutes): the figures in docs/reliability.md
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEBS := prometheus chromium
FAKENVML := exporter/simulate/fakenvml
DEMO_ADDR ?= 127.0.0.1:9400

.PHONY: install demo test lint typecheck pytest bench faults soak proto docs debs fakenvml monitoring clean

install: $(STAMP) debs fakenvml

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
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

fakenvml: $(STAMP)
	@if [ -f $(FAKENVML)/Makefile ]; then $(MAKE) -s -C $(FAKENVML) PYTHON=$(CURDIR)/$(PY); fi

demo: install
	$(VENV)/bin/kube-device-exporter simulate demo --web.listen-address $(DEMO_ADDR)

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

bench: install
	$(PY) -m bench

faults: install
	$(PY) -m bench.faults

soak: install
	$(PY) -m bench.faults --soak

docs: $(STAMP)
	$(PY) -m exporter.metrics > docs/metrics.md

proto: $(STAMP)
	PYTHON=$(CURDIR)/$(PY) proto/generate.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	@if [ -f $(FAKENVML)/Makefile ]; then $(MAKE) -s -C $(FAKENVML) clean; fi
