# kube-device-exporter image: build the wheel and a virtual environment in one stage, copy
# only the environment into a slim runtime. No compiler and no simulated NVML library end up
# in the image: on a node, libnvidia-ml comes from the driver through the NVIDIA container
# toolkit (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility in the DaemonSet).
#
#   make image IMAGE=registry.example.com/kube-device-exporter:0.1.0
#
# Reproducible from the checkout: the base by digest (its tag beside it, for people), every
# dependency from requirements/runtime.lock with its hashes (`make lock` writes it), the
# wheel's build backend from requirements/build.lock; nothing is resolved at build time.

# Behind a TLS-intercepting proxy, hand pip its CA without baking it in (BuildKit):
#   docker build --secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt .

# python:3.11.11-slim-bookworm by digest (docs/deploy.md: how the digest was chosen).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    SOURCE_DATE_EPOCH=315532800
WORKDIR /src
# SOURCE_DATE_EPOCH: the wheel's zip times, so the same source gives the same wheel (and
# the same RECORD in the environment). The tools venv (pip, setuptools: pinned with hashes)
# builds the wheel and installs into the runtime venv from outside (`pip --python`), so the
# runtime venv never holds pip or setuptools.
COPY requirements/build.lock requirements/runtime.lock ./requirements/
RUN --mount=type=secret,id=pip-ca \
    if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python -m venv /opt/tools \
 && /opt/tools/bin/python -m pip install --require-hashes --no-deps -r requirements/build.lock \
 && python -m venv --without-pip /opt/kube-device-exporter \
 && /opt/tools/bin/python -m pip --python /opt/kube-device-exporter/bin/python install \
      --require-hashes --no-deps --no-compile -r requirements/runtime.lock
# README.m[d]: copied when the checkout has one (the package metadata reads it).
COPY pyproject.toml README.m[d] ./
COPY exporter ./exporter
# .pyc files once, here: the root filesystem is read-only on a node (and PYTHONDONTWRITEBYTECODE
# is set), so anything not compiled now is compiled again on every start. unchecked-hash: the
# bytes do not depend on file times, and the image never changes a source file.
RUN /opt/tools/bin/python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/tools/bin/python -m pip --python /opt/kube-device-exporter/bin/python install \
      --no-deps --no-compile /wheels/*.whl \
 && /opt/kube-device-exporter/bin/python -m compileall -q -j 0 \
      --invalidation-mode unchecked-hash /opt/kube-device-exporter \
 && /opt/kube-device-exporter/bin/kube-device-exporter --version

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="kube-device-exporter" \
      org.opencontainers.image.description="Which pod uses which GPU, accelerator or NIC, and how hard" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
# PYTHONMALLOC=malloc (exporter/runtime/heap.py SHIPPED_ENV): on glibc's allocator the heap trimmer
# hands memory back after a big node shrinks; Python's own keeps it near the peak
# (docs/performance.md, "Memory under churn and on a big node").
ENV PATH=/opt/kube-device-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONMALLOC=malloc
# The base's own pip, setuptools and wheel go (nothing installs at run time), and its
# standard library is compiled like the environment (the base ships no .pyc for it).
SHELL ["/bin/sh", "-eu", "-c"]
RUN stdlib="$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" \
 && purelib="$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
 && rm -rf /usr/local/bin/pip* "$purelib"/pip "$purelib"/pip-* \
      "$purelib"/setuptools "$purelib"/setuptools-* "$purelib"/_distutils_hack \
      "$purelib"/distutils-precedence.pth "$purelib"/pkg_resources \
      "$purelib"/wheel "$purelib"/wheel-* /usr/local/bin/wheel \
 && python -m compileall -q -j 0 --invalidation-mode unchecked-hash "$stdlib"
COPY --from=build /opt/kube-device-exporter /opt/kube-device-exporter
COPY LICENSE /usr/share/doc/kube-device-exporter/LICENSE
# Root, as deployed: the kubelet's PodResources socket is root's and a unix socket needs
# write permission to connect, so UID 65532 would start with podresources_up 0. The
# DaemonSet drops every capability, forbids privilege escalation and mounts the root
# read-only (deploy/base/daemonset.yaml); `docker run` without those is not how it runs.
# hadolint ignore=DL3002
USER 0:0
EXPOSE 9405
ENTRYPOINT ["kube-device-exporter"]
