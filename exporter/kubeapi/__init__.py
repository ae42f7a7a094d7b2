"""Pod UIDs, workloads and labels from the Kubernetes API (`--kubernetes.api`, off by default).

client.py speaks the API (metadata only, every request counted), watcher.py keeps this node's
pods current in the background, fed by the API server's pod watch or (podsapi.py) the
kubelet's Pods API where it answers; listwatch.py is the one resumable list, watch and
back-off loop that drives both feeds and the DRA slice watch; workloads.py turns a pod and
its owner chain into the attributes of `k8s.pod.workload.info`. The poller only reads the
watcher's cache.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

from exporter.kubeapi.answers import Limits
from exporter.kubeapi.client import KubeApi, http_client, load_config
from exporter.kubeapi.pods import PodStatusReader
from exporter.kubeapi.watcher import PodWatcher
from exporter.kubeapi.workloads import LabelFilter
from exporter.settings.config import Config

log = logging.getLogger("exporter.kubeapi")

REQUEST_TIMEOUT_SECONDS = 10.0
"""Connect and read deadline of a list page or an owner read (a watch has no read deadline;
its end is bounded by timeoutSeconds plus a grace period)."""


def pod_watcher(config: Config, connect: Callable[[], KubeApi]) -> PodWatcher:
    """The pods of this node: from the kubelet's Pods API when its socket exists (and
    `--kubernetes.dra` is off), else from an API server pod watch."""
    labels = LabelFilter(config.pod_label_patterns)
    socket = Path(config.pods_api_socket) if config.pods_api_socket else None
    if socket is not None and socket.exists() and not config.kubernetes_dra:
        # The kubelet's Pods API: no pod watch on the API server (docs/kubernetes-api.md).
        from exporter.kubeapi.podsapi import KubeletPods

        log.info("pod metadata from the kubelet Pods API at %s", socket)
        feed = functools.partial(KubeletPods, socket=socket)
        return PodWatcher(connect, config.node_name, labels, feed=feed,
                          max_pods=config.kubernetes_max_pods)  # fmt: skip
    # --kubernetes.dra reads whole pods (claim health) from the API watch: kept then.
    log.info("pod metadata from the API server's pod watch (no Pods API socket at %s%s)",
             socket, ", or --kubernetes.dra" if config.kubernetes_dra else "")  # fmt: skip
    return PodWatcher(connect, config.node_name, labels, max_pods=config.kubernetes_max_pods)


def shared_connect(
    config: Config, *, pod_status: PodStatusReader | None = None
) -> Callable[[], KubeApi]:
    """One client for the pod and slice watches: one connection pool, one request count.
    `pod_status`: the pod watch reads whole pods and their DRA claims with it."""
    made: list[KubeApi] = []

    def connect() -> KubeApi:
        if not made:
            made.append(
                KubeApi(
                    http_client(load_config(config.kubeconfig), REQUEST_TIMEOUT_SECONDS),
                    pod_status=pod_status,
                    limits=Limits(objects=config.kubernetes_max_pods),
                )
            )
        return made[0]

    return connect
