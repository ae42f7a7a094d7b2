"""`kube-device-exporter podresources`: what the kubelet reports, for debugging attribution."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.kubelet import GET_DISABLED, SimulatedKubelet
from simulator.scenario import parse_scenario

pytestmark = pytest.mark.peer

SCENARIO = """
node: n
pods:
  - name: p
    namespace: ns
    containers: [{name: c, devices: [{resource: nvidia.com/gpu, ids: ["GPU-x::1"], numa: [1]}]}]
"""


async def inspect(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "exporter", "podresources", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


async def test_list_get_and_a_kubelet_without_get(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    try:
        done = await inspect("--kubelet-socket", str(sock), "-o", "json")
        assert done.returncode == 0, done.stderr
        state = json.loads(done.stdout)
        assert state["api_version"] == "v1"
        device = state["pods"][0]["containers"][0]["devices"][0]
        assert device == {
            "resource_name": "nvidia.com/gpu",
            "device_ids": ["GPU-x::1"],
            "numa_nodes": [1],
        }

        done = await inspect("--kubelet-socket", str(sock), "--pod", "ns/p", "-o", "json")
        assert json.loads(done.stdout)["pod"]["name"] == "p"

        # The exporter's own variable names the socket when the flag does not.
        done = await inspect("-o", "json", env={"KDE_KUBELET_SOCKET": str(sock)})
        assert done.returncode == 0, done.stdout
        assert json.loads(done.stdout)["pods"][0]["name"] == "p"

        kubelet.set_behaviour(get=False)
        done = await inspect("--kubelet-socket", str(sock), "--pod", "ns/p")
        assert done.returncode == 1
        assert GET_DISABLED in done.stdout
    finally:
        await kubelet.stop()


async def test_missing_socket_and_bad_pod_argument(tmp_path: Path) -> None:
    done = await inspect("--kubelet-socket", str(tmp_path / "nope.sock"))
    assert done.returncode == 1
    assert "does not exist" in done.stdout
    done = await inspect("--pod", "no-slash")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "kube-device-exporter: error: --pod: expected NAMESPACE/NAME, got 'no-slash'"
    )


TABLE_SCENARIO = """
node: n
allocatable:
  - {resource: nvidia.com/gpu, ids: [GPU-a, GPU-b, GPU-c, GPU-d], numa: [0]}
  - {resource: rdma/hca, ids: [mlx5_0], numa: [1]}
pods:
  - name: train
    namespace: ml
    containers:
      - name: main
        devices:
          - {resource: nvidia.com/gpu, ids: [GPU-a, GPU-b], numa: [0]}
          - {resource: rdma/hca, ids: [mlx5_0], numa: [1]}
      - name: sidecar
  - name: web
    namespace: shop
    containers: [{name: nginx}]
"""


async def test_a_table_by_default_and_filters(tmp_path: Path) -> None:
    """The dense node's answer is mostly pods without devices: a table, and filters."""
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(TABLE_SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    try:
        done = await inspect("--kubelet-socket", str(sock))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "NAMESPACE   POD     CONTAINER   RESOURCE         DEVICES       NUMA",
            "ml          train   main        nvidia.com/gpu   GPU-a,GPU-b   0",
            "ml          train   main        rdma/hca         mlx5_0        1",
            "ml          train   sidecar     <none>           <none>        <none>",
            "shop        web     nginx       <none>           <none>        <none>",
            "",
            "RESOURCE         COUNT   DEVICES",
            "nvidia.com/gpu   4       GPU-a,GPU-b,GPU-c,... (+1)",
            "rdma/hca         1       mlx5_0",
        ]
        done = await inspect("--kubelet-socket", str(sock), "--devices-only")
        assert [line.split()[2:4] for line in done.stdout.split("\n\n")[0].splitlines()[1:]] == [
            ["main", "nvidia.com/gpu"],
            ["main", "rdma/hca"],
        ]
        done = await inspect(
            "--kubelet-socket", str(sock), "--resource", "nvidia.com/*", "-o", "json"
        )
        state = json.loads(done.stdout)
        assert [(p["name"], [c["name"] for c in p["containers"]]) for p in state["pods"]] == [
            ("train", ["main"])
        ]
        assert [d["resource_name"] for d in state["pods"][0]["containers"][0]["devices"]] == [
            "nvidia.com/gpu"
        ]
        assert {d["resource_name"] for d in state["allocatable"]} == {"nvidia.com/gpu"}
        done = await inspect("--kubelet-socket", str(sock), "-n", "shop", "--devices-only")
        assert done.stdout.startswith("No pods match.")
        done = await inspect("--kubelet-socket", str(sock), "-n", "shop")
        assert done.stdout.splitlines()[1].split() == [
            "shop",
            "web",
            "nginx",
            "<none>",
            "<none>",
            "<none>",
        ]
    finally:
        await kubelet.stop()
