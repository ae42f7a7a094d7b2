"""A host read that blocks or sleeps never stops the exporter, its readiness or SIGTERM; a
process whose `stat` cannot be used counts in the group of no pod; SIGHUP reloads, never
kills (issue 25, items 1, 8 and 10). Real exporter processes on a simulated node."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.node import SimulatedNode
from simulator.ports import free_port
from simulator.scenario import parse_scenario
from tests.stuck_reads import ENV as STUCK_ENV

pytestmark = pytest.mark.peer

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000007"
SCENARIO = f"""
node: stuck-node
allocatable:
  - {{resource: nvidia.com/gpu, ids: ["{GPU}"]}}
pods:
  - name: alpha
    namespace: team-a
    containers:
      - {{name: train, pids: [1001, 1002, 1003, 1004], devices: [{{resource: nvidia.com/gpu, ids: ["{GPU}"]}}]}}
procfs:
  cgroup: v2
  driver: systemd
  runtime: containerd
  cgroupns: false
  host_processes: [900]
nvidia:
  pid_namespace: host
  gpus:
    - uuid: {GPU}
      processes:
        - {{pid: 1001, memory: 1GiB}}
        - {{pid: 1002, memory: 1GiB}}
        - {{pid: 1003, memory: 1GiB}}
        - {{pid: 1004, memory: 1GiB}}
        - {{pid: 900, memory: 1GiB}}
"""
STUCK_SITE = Path(__file__).parent / "stuck_reads_site"
EXIT_WITHIN = 10.0
"""Seconds from SIGTERM to exit: the DaemonSet's terminationGracePeriodSeconds."""


class Running:
    def __init__(self, node: SimulatedNode, proc: subprocess.Popen[bytes], port: int) -> None:
        self.node, self.proc, self.port = node, proc, port
        self.url = f"http://127.0.0.1:{port}/metrics"

    async def metrics(self, timeout: float = 30.0) -> str:
        """/metrics once the first cycle is in (503 before)."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                try:
                    async with http.get(self.url) as r:
                        if r.status == 200:
                            return await r.text()
                except aiohttp.ClientError:
                    pass
                assert self.proc.poll() is None, f"exporter exited: {self.log()}"
                await asyncio.sleep(0.1)
        raise AssertionError(f"not ready in {timeout:g}s; log:\n{self.log()}")

    def log(self) -> str:
        return (self.node.workdir / "exporter.log").read_text()

    def terminate(self) -> float:
        """Seconds from SIGTERM to exit (fails past EXIT_WITHIN)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running {EXIT_WITHIN:g}s after SIGTERM") from None
        return time.monotonic() - started


def spawn(
    node: SimulatedNode, env: dict[str, str], port: int, args: tuple[str, ...]
) -> subprocess.Popen[bytes]:
    with (node.workdir / "exporter.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "exporter", *node.exporter_args(), "--collect-interval",
             "1s", "--web.listen-address", f"127.0.0.1:{port}", *args],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


@asynccontextmanager
async def exporter(
    tmp_path: Path, *args: str, stuck: tuple[Path, ...] = (), before: object = None
) -> AsyncIterator[Running]:
    """The exporter process on the simulated node (procfs written once, at t=0), after
    `before(node)` has changed the node's files."""
    node = SimulatedNode(parse_scenario(SCENARIO, name="stuck"), tmp_path / "node")
    await node.start()
    node.advance()
    if callable(before):
        before(node)
    port = free_port()
    env = {**os.environ, **node.env()}
    if stuck:
        env["PYTHONPATH"] = os.pathsep.join([str(STUCK_SITE), str(Path.cwd())])
        env[STUCK_ENV] = os.pathsep.join(str(p) for p in stuck)
    proc = spawn(node, env, port, args)
    try:
        yield Running(node, proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await node.stop()
        for part in node.parts:
            part.close()


def container_processes(text: str) -> dict[str, float]:
    """hw_gpu_container_processes by pod ("" for the group of no pod)."""
    return {
        s.labels.get("k8s_pod_name", ""): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "hw_gpu_container_processes"
    }


def value(text: str, name: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    return None


def hostile_stats(node: SimulatedNode) -> None:
    """1002's stat a FIFO (no writer: open() without O_NONBLOCK waits for ever), 1003's
    oversized, 1004's with a start time in non-ASCII digits (str.isdigit says yes)."""
    proc = node.workdir / "proc"
    (proc / "1002" / "stat").unlink()
    os.mkfifo(proc / "1002" / "stat")
    (proc / "1003" / "stat").write_text("1003 (" + "x" * 8000 + ") S" + " 1" * 50 + "\n")
    (proc / "1004" / "stat").write_text("1004 (p) S" + " 1" * 18 + " ²³ 0 0\n")


async def test_a_fifo_or_a_bad_stat_counts_in_no_pod_and_sigterm_is_prompt(
    tmp_path: Path,
) -> None:
    async with exporter(tmp_path, before=hostile_stats) as running:
        text = await running.metrics()
        # 1001 is the pod's; 1002-1004 cannot be placed: with host process 900, no pod.
        assert container_processes(text) == {"alpha": 1.0, "": 4.0}
        assert value(text, "kube_device_exporter_attribution_enabled") == 1.0
        took = running.terminate()
    assert took < EXIT_WITHIN
    print(f"SIGTERM to exit with a FIFO at /proc/1002/stat: {took:.2f} s")


async def test_reads_that_sleep_turn_attribution_off_and_sigterm_is_prompt(
    tmp_path: Path,
) -> None:
    """/proc/1001/stat and the NUMA map's cpulist read as a hung mount does: the exporter
    is ready within the deadline, attribution off (said once), device series kept."""
    cpulist = tmp_path / "node" / "sysfs-empty" / "devices" / "system" / "node" / "node0"
    cpulist.mkdir(parents=True)
    (cpulist / "cpulist").write_text("0-3\n")
    stuck = (tmp_path / "node" / "proc" / "1001" / "stat", cpulist / "cpulist")
    async with exporter(tmp_path, stuck=stuck) as running:
        text = await running.metrics()
        assert value(text, "kube_device_exporter_attribution_enabled") == 0.0
        assert value(text, "hw_gpu_memory_usage_bytes") is not None
        await asyncio.sleep(3)  # more cycles: still serving, nothing said twice
        assert (value(await running.metrics(), "kube_device_exporter_cycles_total") or 0) > 2
        took = running.terminate()
        log = running.log()
    assert log.count("has not returned in 1s") == 1, log
    assert log.count("takes over") == 1, log
    assert took < EXIT_WITHIN
    print(f"SIGTERM to exit with two reads stuck: {took:.2f} s")


def stuck_ifindex(tmp_path: Path) -> Path:
    """The netdev source reads class/net/*/ifindex while it is made (is this the host's
    network namespace?)."""
    net = tmp_path / "node" / "sysfs-empty" / "class" / "net" / "eth0"
    net.mkdir(parents=True)
    (net / "ifindex").write_text("2\n")
    return net / "ifindex"


AUTO = ("--collector.netdev.vf-netlink", "auto")


async def test_sigterm_while_a_source_is_made_with_a_read_stuck(tmp_path: Path) -> None:
    async with exporter(tmp_path, *AUTO, stuck=(stuck_ifindex(tmp_path),)) as running:
        await asyncio.sleep(3)
        assert running.proc.poll() is None
        assert "serving on" not in running.log(), "the read was not stuck"
        took = running.terminate()
    assert took < EXIT_WITHIN


async def test_a_source_stuck_while_made_is_left_out(tmp_path: Path) -> None:
    """The exporter starts without it after SOURCE_START_SECONDS, the others collecting."""
    async with exporter(tmp_path, *AUTO, stuck=(stuck_ifindex(tmp_path),)) as running:
        text = await running.metrics(timeout=30)
        success = {
            s.labels["source"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "kube_device_exporter_source_success"
        }
        assert success["netdev"] == 0.0 and success["nvml"] == 1.0, success
        assert container_processes(text) == {"alpha": 4.0, "": 1.0}
        running.terminate()
    assert "source netdev could not start: not made within 10s" in running.log()


async def test_sighup_is_logged_and_never_kills(tmp_path: Path) -> None:
    async with exporter(tmp_path) as running:
        await running.metrics()
        running.proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(1.5)
        assert running.proc.poll() is None, "SIGHUP ended the process"
        await running.metrics()
        assert "SIGHUP: nothing to reload (no --web.config.file)" in running.log()
        running.terminate()


def test_asyncio_run_does_not_wait_for_a_stuck_default_executor_call() -> None:
    """asyncio.run waits for the default executor's threads at its end (for ever on 3.11):
    with the exporter's DaemonExecutor a stuck call is left behind."""
    code = (
        "import asyncio, threading, time\n"
        "from exporter.runtime.threads import DaemonExecutor\n"
        "async def main():\n"
        "    asyncio.get_running_loop().set_default_executor(DaemonExecutor())\n"
        "    asyncio.get_running_loop().run_in_executor(None, threading.Event().wait)\n"
        "    print(await asyncio.to_thread(lambda: 'served'), flush=True)\n"
        "asyncio.run(main())\n"
    )
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN,
    )
    assert out.returncode == 0 and out.stdout == "served\n", out.stderr
    assert time.monotonic() - started < EXIT_WITHIN


def test_sitecustomize_hook_is_test_only() -> None:
    """The stuck-read hook lives under tests/, never in the product."""
    assert not list(Path("exporter").rglob("sitecustomize.py"))


@pytest.fixture(autouse=True)
def _fakenvml_built() -> Iterator[None]:
    from simulator import nvml as simnvml

    try:
        simnvml.preload_library()
    except simnvml.FakeNvmlNotBuilt as exc:
        pytest.fail(str(exc))
    yield
