# kube-device-exporter image: build the wheel and a virtual environment in one stage, copy
# only the environment into a slim runtime. No compiler and no simulated NVML library end up
# in the image: on a node, libnvidia-ml comes from the driver through the NVIDIA container
# toolkit (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility in the DaemonSet).
#
#   docker build -t kube-device-exporter:0.1.0 .

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# README.m[d]: copied when the checkout has one (the package metadata reads it).
COPY pyproject.toml README.m[d] ./
COPY exporter ./exporter
RUN python -m venv /opt/kube-device-exporter \
 && /opt/kube-device-exporter/bin/pip install --no-compile . \
 && /opt/kube-device-exporter/bin/kube-device-exporter --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kube-device-exporter" \
      org.opencontainers.image.description="Which pod uses which GPU, accelerator or NIC, and how hard" \
      org.opencontainers.image.licenses="Apache-2.0"
# PYTHONMALLOC=malloc (exporter/heap.py SHIPPED_ENV): on glibc's allocator the heap trimmer
# hands memory back after a big node shrinks; Python's own keeps it near the peak
# (docs/performance.md, "Memory under churn and on a big node").
ENV PATH=/opt/kube-device-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONMALLOC=malloc
COPY --from=build /opt/kube-device-exporter /opt/kube-device-exporter
# Non-root by default; the DaemonSet runs it as UID 0 with every capability dropped because
# the kubelet's PodResources socket is root's (deploy/base/daemonset.yaml says why).
USER 65532:65532
EXPOSE 9405
ENTRYPOINT ["kube-device-exporter"]
