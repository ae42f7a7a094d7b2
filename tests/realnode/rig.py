"""A real node, the NVML stand-in showing the devices our plugin advertises, and the
exporter against them as users run it (a process of its own, a 1 s cycle, the kubelet's
container-log folder): what the real-kubelet tests scrape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tests.realnode.exporter import ExporterProcess
from tests.realnode.nvml import StandInNvml
from tests.realnode.standalone import GPUS, MIG_PARENT, MIGS, StandaloneNode


class Rig:
    """A node, the NVML stand-in, and the exporter against them."""

    def __init__(self, node: StandaloneNode, workdir: Path) -> None:
        self.node = node
        self.nvml = StandInNvml(workdir, GPUS, MIG_PARENT, MIGS)
        self.exporter = ExporterProcess(
            node.socket, node.name, workdir, env=self.nvml.env(),
            flags=["--collect-interval", "1s", "--path.container-logs", str(node.node.container_logs),
                   # a List every cycle: these tests time kubelet restarts against the
                   # exporter's List period and count its calls per cycle
                   "--kubernetes.poll-interval", "1s"],
        )  # fmt: skip

    def close(self) -> None:
        self.exporter.stop()
        self.nvml.close()


def rig_for(node: StandaloneNode, workdir: Path) -> Iterator[Rig]:
    """The rig with its exporter started; stopped and closed when the caller is done."""
    rig = Rig(node, workdir)
    try:
        rig.exporter.start()
        yield rig
    finally:
        rig.close()
