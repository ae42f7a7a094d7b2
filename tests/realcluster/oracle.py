"""What docs/kubernetes-api.md says `k8s_pod_workload_info` holds for a pod, computed from
the API server's own objects with the tests' client (not the exporter's code): the pod's
UID, its controller and, above a ReplicaSet or Job, that owner's controller; the workload is
the top of that chain, or the pod itself when nobody controls it."""

from __future__ import annotations

from typing import Any

from tests.realcluster.api import Api, ApiStatus

OWNER_PATHS = {"ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets/{name}",
               "Job": "/apis/batch/v1/namespaces/{ns}/jobs/{name}"}  # fmt: skip
KIND_LABEL = {"Deployment": "k8s_deployment_name", "ReplicaSet": "k8s_replicaset_name",
              "StatefulSet": "k8s_statefulset_name", "DaemonSet": "k8s_daemonset_name",
              "Job": "k8s_job_name", "CronJob": "k8s_cronjob_name"}  # fmt: skip

Series = frozenset[tuple[str, str]]


def controller(meta: dict[str, Any]) -> dict[str, Any] | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def info(api: Api, pod: dict[str, Any], node: str, labels: tuple[str, ...] = ()) -> Series:
    meta = pod["metadata"]
    ns, name = meta["namespace"], meta["name"]
    out = {"k8s_node_name": node, "k8s_namespace_name": ns, "k8s_pod_name": name,
           "k8s_pod_uid": meta["uid"]}  # fmt: skip
    chain = []
    owner = controller(meta)
    if owner is not None:
        chain.append(owner)
        if owner["kind"] in OWNER_PATHS:
            try:
                parent = api.get(OWNER_PATHS[owner["kind"]].format(ns=ns, name=owner["name"]))
            except ApiStatus as exc:
                if exc.code != 404:
                    raise
            else:
                above = controller(parent["metadata"])
                if above is not None:
                    chain.append(above)
    for ref in chain:
        if ref["kind"] in KIND_LABEL:
            out[KIND_LABEL[ref["kind"]]] = ref["name"]
    top = chain[-1] if chain else {"kind": "Pod", "name": name}
    out |= {"k8s_workload_kind": top["kind"], "k8s_workload_name": top["name"]}
    for key in labels:
        if key in (meta.get("labels") or {}):
            out[f"k8s_pod_label_{key}"] = meta["labels"][key]
    return frozenset(out.items())
