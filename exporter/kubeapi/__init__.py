"""Pod UIDs, workloads and labels from the Kubernetes API (`--kubernetes.api`, off by default).

client.py speaks the API (metadata only, every request counted), watcher.py keeps this node's
pods current in the background, workloads.py turns a pod and its owner chain into the
attributes of `k8s.pod.workload.info`. The poller only reads the watcher's cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from exporter.cli.config import Config
from exporter.kubeapi.client import KubeApi, http_client, load_config
from exporter.kubeapi.slicewatch import SliceWatcher
from exporter.kubeapi.watcher import PodWatcher
from exporter.kubeapi.workloads import LabelFilter

log = logging.getLogger("exporter.kubeapi")

REQUEST_TIMEOUT_SECONDS = 10.0
"""Connect and read deadline of a list page or an owner read (a watch has no read deadline;
its end is bounded by timeoutSeconds plus a grace period)."""


def build_watchers(config: Config) -> tuple[PodWatcher, SliceWatcher | None]:
    """The pod watch, and with `--kubernetes.dra` the ResourceSlice watch, on one client."""
    connect = shared_connect(config, full_pods=config.kubernetes_dra)
    labels = LabelFilter(config.pod_label_patterns)
    socket = Path(config.pods_api_socket) if config.pods_api_socket else None
    pods: PodWatcher
    if socket is not None and socket.exists() and not config.kubernetes_dra:
        # The kubelet's Pods API: no pod watch on the API server (docs/kubernetes-api.md).
        from exporter.kubeapi.podsapi import KubeletPodWatcher

        pods = KubeletPodWatcher(connect, config.node_name, labels, socket=socket)
        log.info("pod metadata from the kubelet Pods API at %s", socket)
    else:
        # --kubernetes.dra reads whole pods (claim health) from the API watch: kept then.
        pods = PodWatcher(connect, config.node_name, labels)
        log.info("pod metadata from the API server's pod watch (no Pods API socket at %s%s)",
                 socket, ", or --kubernetes.dra" if config.kubernetes_dra else "")  # fmt: skip
    slices = SliceWatcher(connect, config.node_name) if config.kubernetes_dra else None
    return pods, slices


def build_watcher(config: Config) -> PodWatcher:
    return build_watchers(config)[0]


def shared_connect(config: Config, *, full_pods: bool = False) -> Callable[[], KubeApi]:
    """One client for the pod and slice watches: one connection pool, one request count.
    `full_pods`: the pod watch reads whole pods (their DRA claims' health, claimhealth.py)."""
    made: list[KubeApi] = []

    def connect() -> KubeApi:
        if not made:
            made.append(
                KubeApi(
                    http_client(load_config(config.kubeconfig), REQUEST_TIMEOUT_SECONDS),
                    full_pods=full_pods,
                )
            )
        return made[0]

    return connect
