"""The workloads the real-cluster tier makes in its namespace: a bare pod, a Deployment, a
StatefulSet and a DaemonSet, each holding a device of the tests' own plugin on the node
(tests/test_real_cluster_workloads.py, and test_real_cluster_podsapi.py in a namespace of
its own)."""

from __future__ import annotations

from typing import Any

from tests.realcluster.node import pod_spec

NS = "kde-real"
"""The tier's namespace."""


def template(app: str, **spec: Any) -> dict[str, Any]:
    """A pod template labelled `app` (and team ml), holding one device."""
    return {"metadata": {"labels": {"app": app, "team": "ml"}}, "spec": pod_spec(**spec)}


def objects(node: str) -> list[dict[str, Any]]:
    """The four workloads, in NS, each with its pods on `node`."""

    def meta(name: str) -> dict[str, str]:
        return {"name": name, "namespace": NS}

    on_node = {"nodeSelector": {"kubernetes.io/hostname": node}}
    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta("debug"), "labels": {"team": "sre"}},
         "spec": {**pod_spec(), "nodeName": node}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("train"),
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "train"}},
                  "template": template("train") | {"spec": {**pod_spec(), **on_node}}}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("db"),
         "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                  "template": template("db") | {"spec": {**pod_spec(), **on_node}}}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("agent"),
         "spec": {"selector": {"matchLabels": {"app": "agent"}},
                  "template": template("agent") | {"spec": {**pod_spec(), **on_node}}}},
    ]  # fmt: skip
