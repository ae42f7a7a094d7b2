"""The exporter as a process of the tier, and its /metrics read back as series.

`simulated_node()` runs `kde-simulate` (the exporter against the simulated
kubelet, as tests/test_kubeapi_prometheus.py does with the loopback API server) with
`--kubernetes.api` and a kubeconfig for the real API server: the pods the scenario's kubelet
lists are the real pods' names, so the join of PodResources and the API watch is the real one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from simulator.ports import free_port
from tests.realcluster.daemons import Daemon, wait_for

RESOURCE = "nvidia.com/gpu"
"""The resource the simulated kubelet hands out, one device per pod (no NVML here: the
devices are known to PodResources only, enough for the allocation and info series)."""

Series = frozenset[tuple[str, str]]


def scenario(path: Path, node: str, pods: list[tuple[str, str]]) -> Path:
    """A simulated node named `node` whose kubelet lists `pods` ((namespace, name)), each
    with one container `c` holding one device of RESOURCE."""
    ids = [f"GPU-00000000-0000-4000-8000-{i:012d}" for i in range(max(len(pods), 1))]
    doc: dict[str, Any] = {
        "node": node,
        "kubelet": {"api": "v1"},
        "allocatable": [{"resource": RESOURCE, "ids": ids}],
        "pods": [
            {"name": name, "namespace": ns,
             "containers": [{"name": "c", "devices": [{"resource": RESOURCE, "ids": [dev]}]}]}
            for (ns, name), dev in zip(pods, ids, strict=False)
        ],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    return path


class Metrics:
    def __init__(self, url: str, daemon: Daemon) -> None:
        self.url = url
        self.daemon = daemon

    def text(self) -> str:
        with urllib.request.urlopen(self.url, timeout=5) as resp:
            return str(resp.read().decode())

    def series(self, name: str) -> dict[Series, float]:
        """Every sample of family `name`: its label set -> value."""
        out: dict[Series, float] = {}
        for family in text_string_to_metric_families(self.text()):
            for sample in family.samples:
                if sample.name == name:
                    out[frozenset(sample.labels.items())] = sample.value
        return out

    def value(self, name: str, **labels: str) -> float | None:
        for labelset, value in self.series(name).items():
            if set(labels.items()) <= labelset:
                return value
        return None

    def wait(self, what: str, predicate: Any, timeout: float = 30.0) -> None:
        def ready() -> bool:
            try:
                return bool(predicate(self))
            except (urllib.error.URLError, OSError):
                return False

        wait_for(what, ready, timeout, [self.daemon], interval=0.25)


ASK_EVERY_CYCLE = ("--kubernetes.poll-interval", "1s")
"""The kubelet asked every cycle: these pods run no process on a device, which by default
makes their labels wait up to 30 s for the next poll; the tests here are about what the
kubelet and the API server answer, not when the exporter asks (test_kubelet_schedule.py)."""


@contextlib.contextmanager
def on_node(workdir: Path, socket: Path, node: str, kubeconfig: Path,
            *flags: str, env: dict[str, str] | None = None,
            sysfs: Path | None = None) -> Iterator[Metrics]:  # fmt: skip
    """The exporter as the DaemonSet runs it, on the real kubelet's PodResources socket, with
    an empty sysfs (this machine's devices are not the test's) unless `sysfs` names a fixture
    tree (tests/sysfs_support.py), and no NVML (absent here) unless `env` loads the NVML
    stand-in (tests/realnode/nvml.py)."""
    if sysfs is None:
        sysfs = workdir / "sysfs-empty"
        (sysfs / "class").mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "exporter", "--kubelet-socket", str(socket),
            "--node-name", node, "--path.sysfs", str(sysfs),
            "--collector.netdev.vf-netlink", "false", "--collect-interval", "1s",
            *ASK_EVERY_CYCLE,
            "--kubernetes.api", "--kubernetes.kubeconfig", str(kubeconfig), *flags]  # fmt: skip
    with _running(workdir, "exporter-node", argv, env or {}) as metrics:
        yield metrics


@contextlib.contextmanager
def simulated_node(workdir: Path, scenario_path: Path, kubeconfig: Path,
                   *flags: str) -> Iterator[Metrics]:  # fmt: skip
    argv = [sys.executable, "-m", "simulator", str(scenario_path),
            "--collect-interval", "500ms", *ASK_EVERY_CYCLE, "--kubernetes.api",
            "--kubernetes.kubeconfig", str(kubeconfig), *flags]  # fmt: skip
    # The simulated node keeps its sockets and trees in a folder of the test's.
    env = {"KDE_SIMULATE_WORKDIR": str(workdir / "simulated-node")}
    with _running(workdir, "exporter", argv, env) as metrics:
        yield metrics


@contextlib.contextmanager
def _running(workdir: Path, name: str, argv: list[str], env: dict[str, str]) -> Iterator[Metrics]:
    port = free_port()
    daemon = Daemon(
        name,
        [*argv, "--web.listen-address", f"127.0.0.1:{port}"],
        workdir,
        # The tier's own KDE_E2E_* variables are not the exporter's.
        env={**{k: v for k, v in os.environ.items() if not k.startswith("KDE_")}, **env},
    )
    daemon.start()
    metrics = Metrics(f"http://127.0.0.1:{port}/metrics", daemon)
    try:
        metrics.wait("the exporter's /metrics", lambda m: m.text(), 30)
        yield metrics
    finally:
        stopping = time.monotonic()
        daemon.stop(grace=15)
        assert time.monotonic() - stopping < 15, daemon.tail()
