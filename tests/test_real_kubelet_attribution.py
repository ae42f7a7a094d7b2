"""Attribution against real containers: the NVML stand-in reports the real host PIDs of
containers that containerd and runc started for the real kubelet, and the exporter
resolves them as it does on a node — the host's /proc, the real cgroup paths (cgroup v1
hybrid, cgroupfs driver, under the kubelet's cgroupRoot) and the kubelet's own
/var/log/containers links — to per-container usage series.

Tier: real node (tests/realnode); skips with one line when the kubelet is missing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.realnode.exporter import Series, series
from tests.realnode.kubelet import container_ids
from tests.realnode.nvml import GIB
from tests.realnode.podresources import Lister, holdings
from tests.realnode.procs import pids_in_container
from tests.realnode.rig import Rig, rig_for
from tests.realnode.standalone import (
    DUO,
    GPU,
    GPUS,
    MIG,
    NAMESPACE,
    SOLO,
    StandaloneNode,
    kubelet_or_skip,
    standalone_node,
)

pytestmark = pytest.mark.peer

KUBELET = kubelet_or_skip()
USAGE = "hw_gpu_container_memory_usage_bytes"


@pytest.fixture(scope="module")
def workloads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """The node with SOLO (a GPU) and DUO (two MIG slices), the stand-in and the exporter."""
    for node in standalone_node(KUBELET, pods=(SOLO, DUO)):
        yield from rig_for(node, tmp_path_factory.mktemp("attribution"))


def held(node: StandaloneNode) -> dict[tuple[str, str], str]:
    """(pod, container) -> the one device it holds."""
    lister = Lister(node.socket)
    try:
        return {
            (pod, container): ids[0]
            for (_, pod, container), resources in holdings(lister.list()).items()
            for ids in resources.values()
        }
    finally:
        lister.close()


def container_pids(node: StandaloneNode, pod: str, container: str) -> list[int]:
    found = node.kubelet.wait_pod(pod)
    pids = pids_in_container(container_ids(found)[container])
    assert pids, f"no process in {pod}/{container}'s cgroup"
    return pids


def usage(samples: list[Series], **labels: str) -> list[Series]:
    return series(samples, USAGE, **labels)


def test_usage_resolves_to_real_containers_through_proc_and_cgroups(workloads: Rig) -> None:
    """The stand-in lists the real PIDs of SOLO's container on its GPU, of DUO's two
    containers on their MIG slices, and this test process (a host process) on a free GPU:
    each container's usage series carries its pod, container and pod UID; the host
    process lands in the series without pod labels."""
    node = workloads.node
    devices = held(node)
    solo = SOLO.static_name(node.name)
    duo = DUO.static_name(node.name)
    solo_gpu = devices[(solo, "main")]
    free_gpu = next(g for g in GPUS if g not in devices.values())
    solo_pids = container_pids(node, SOLO.name, "main")
    left_pids = container_pids(node, DUO.name, "left")
    right_pids = container_pids(node, DUO.name, "right")
    workloads.nvml.show(
        {
            solo_gpu: solo_pids,
            devices[(duo, "left")]: left_pids,
            devices[(duo, "right")]: right_pids,
            free_gpu: [os.getpid()],
        }
    )
    uid = node.kubelet.wait_pod(SOLO.name)["metadata"]["uid"]
    deadline = time.monotonic() + 15
    samples: list[Series] = []
    while time.monotonic() < deadline:
        samples = workloads.exporter.scrape()
        if usage(samples, k8s_pod_name=solo) and usage(samples, hw_id=free_gpu):
            break
        time.sleep(0.2)
    (solo_usage,) = usage(samples, k8s_pod_name=solo)
    assert solo_usage.labels["k8s_namespace_name"] == NAMESPACE
    assert solo_usage.labels["k8s_container_name"] == "main"
    assert solo_usage.labels["hw_id"] == solo_gpu
    assert solo_usage.labels["k8s_pod_uid"] == uid
    assert solo_usage.labels["hw_allocation_requested"] == "true"
    assert solo_usage.value == GIB * len(solo_pids)
    for container, pids in (("left", left_pids), ("right", right_pids)):
        (mig,) = usage(samples, k8s_pod_name=duo, k8s_container_name=container)
        assert mig.labels["hw_id"] == devices[(duo, container)]
        assert mig.value == GIB * len(pids)
    (host,) = usage(samples, hw_id=free_gpu)
    assert "k8s_pod_name" not in host.labels and host.value == GIB
    assert [s.value for s in series(samples, "kube_device_exporter_attribution_enabled")] == [1.0]


def test_the_kubelets_container_log_links_name_the_containers(workloads: Rig) -> None:
    """What the resolver reads for names: the kubelet's real /var/log/containers links,
    `<pod>_<namespace>_<container>-<id>.log` (here in our namespace's folder)."""
    node = workloads.node
    names = sorted(p.name for p in node.node.container_logs.iterdir())
    for pod, containers in ((SOLO, ("main",)), (DUO, ("left", "right"))):
        ids = container_ids(node.kubelet.wait_pod(pod.name))
        for container in containers:
            expected = f"{pod.static_name(node.name)}_{NAMESPACE}_{container}-{ids[container]}.log"
            assert expected in names, names


def test_gpu_and_mig_resources_are_the_plugins(workloads: Rig) -> None:
    """The allocation series of the attributed containers name the plugin's resources."""
    samples = workloads.exporter.scrape()
    resources = {s.labels["hw_allocation_resource"] for s in series(samples, "hw_allocation_info")}
    assert resources == {GPU, MIG}
