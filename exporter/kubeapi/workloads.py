"""Pure: a pod's metadata and its owner's controller -> the attributes of its info series.

Names are the OpenTelemetry Kubernetes semantic conventions (`k8s.pod.uid`,
`k8s.deployment.name`, `k8s.job.name`, `k8s.pod.label.<key>`...). `k8s.workload.kind` and
`k8s.workload.name` (ours) name the top of the owner chain whatever its kind, so one
`sum by (k8s_workload_name)` covers Deployments, Jobs, StatefulSets and custom controllers
(a Kubeflow PyTorchJob, a LeaderWorkerSet) alike; a pod nobody controls is its own
workload (kind `Pod`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from exporter.kubeapi.pods import OwnerRef, PodMeta
from exporter.model import PodInfo

KIND_ATTRIBUTE = {
    "Deployment": "k8s.deployment.name",
    "ReplicaSet": "k8s.replicaset.name",
    "StatefulSet": "k8s.statefulset.name",
    "DaemonSet": "k8s.daemonset.name",
    "Job": "k8s.job.name",
    "CronJob": "k8s.cronjob.name",
}
LABEL_PREFIX = "k8s.pod.label."


class LabelFilter:
    """Pod label keys allowed onto the info series: any regex matching the whole key."""

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self.patterns = tuple(re.compile(p) for p in patterns)
        self.allows = functools.lru_cache(maxsize=4096)(self._allows)

    def _allows(self, key: str) -> bool:
        return any(p.fullmatch(key) for p in self.patterns)


def pod_info(pod: PodMeta, parent: OwnerRef | None, labels: LabelFilter) -> PodInfo:
    """`parent` is the controller of the pod's own controller (a ReplicaSet's Deployment)."""
    attrs: list[tuple[str, str]] = [("k8s.pod.uid", pod.uid)]
    chain = [ref for ref in (pod.owner, parent if pod.owner else None) if ref is not None]
    attrs += [(KIND_ATTRIBUTE[ref.kind], ref.name) for ref in chain if ref.kind in KIND_ATTRIBUTE]
    top = chain[-1] if chain else OwnerRef("Pod", pod.name, pod.uid)
    attrs += [("k8s.workload.kind", top.kind), ("k8s.workload.name", top.name)]
    attrs += [(LABEL_PREFIX + k, v) for k, v in pod.labels if labels.allows(k)]
    return PodInfo(pod.namespace, pod.name, tuple((k, v) for k, v in attrs if v))
