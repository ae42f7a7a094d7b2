"""Test support: one deterministic cycle against the simulated kubelet, golden files."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from exporter.attribution.resolver import ProcessResolver
from exporter.derive.energy import EnergyLedger
from exporter.derive.numa import CpuNodeMap
from exporter.derive.placement import PlacementReader
from exporter.ids import ResourceMatcher
from exporter.model import PodResourcesHealth, PodResourcesState, Snapshot, SourceResult
from exporter.podresources.client import PodResourcesClient
from exporter.sinks.prometheus import render
from exporter.sources import Source
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import Scenario
from tests.support.cycle import make_poller

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
FIXED_WALL_TIME = 1_800_000_000.0


class Clock:
    """Monotonic seconds the test moves by hand (`clock.now = 30`)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FixedKubelet:
    """A PodResources client (for the poller) answering whatever `state` is now, and counting
    its polls; subclasses answer otherwise."""

    def __init__(self, state: PodResourcesState) -> None:
        self.state = state
        self.calls = 0

    async def poll(self, *, fresh_allocatable: bool = False) -> PodResourcesState:
        self.calls += 1
        return self.state

    def health(self) -> PodResourcesHealth:
        return PodResourcesHealth(api_version="v1", connected=True)

    def socket_changed(self) -> bool:
        return False  # no socket: no kubelet restarts

    def restarting(self) -> bool:
        return False

    async def close_channel(self) -> None:
        return None  # no channel: nothing kept between polls

    async def close(self) -> None:
        return None


class StaticSource:
    """A source that returns a fixed result (for tests of the join and the sinks)."""

    def __init__(self, result: SourceResult) -> None:
        self.result = result
        self.closed = False

    def collect(self) -> SourceResult:
        return self.result

    def close(self) -> None:
        self.closed = True


async def one_cycle(
    scenario: Scenario,
    socket_path: Path,
    sources: Mapping[str, Source],
    *,
    t: float = 0.0,
    patterns: tuple[str, ...] | None = None,
    sysfs: Path | None = None,
    resolver: ProcessResolver | None = None,
    process_series: bool = False,
) -> Snapshot:
    """Serve `scenario` at time `t`, run one exporter cycle with frozen clocks, return it.

    Frozen clocks make durations 0 and timestamps FIXED_WALL_TIME, so the whole
    /metrics output is byte-for-byte reproducible. `sysfs`: where the CPU -> NUMA map is
    read (None: no map, as for a scenario without a `sysfs:` section, whose exporter would
    read the host's)."""
    kubelet = SimulatedKubelet(scenario, socket_path, clock=lambda: t)
    await kubelet.start()
    client = PodResourcesClient(socket_path, clock=lambda: 0.0, wall_clock=lambda: FIXED_WALL_TIME)
    poller = make_poller(
        node=scenario.node,
        sources=sources,
        client=client,
        matcher=ResourceMatcher(patterns) if patterns else None,
        cpu_nodes=CpuNodeMap(sysfs) if sysfs else None,
        clock=lambda: 0.0,
        wall_clock=lambda: FIXED_WALL_TIME,
        resolver=resolver,
        process_series=process_series,
        parts=[*([PlacementReader(sysfs).step] if sysfs else []), EnergyLedger().step],
    )
    try:
        return await poller.run_once()
    finally:
        await client.close()
        await kubelet.stop()


def metrics_text(snapshot: Snapshot, schema: Sequence[str] = ("native",)) -> str:
    """The whole Prometheus text output, with the one machine-dependent value masked."""
    text = render(snapshot, schema).text.decode()
    return re.sub(r'python_version="[^"]*"', 'python_version="X"', text)


def assert_golden(name: str, text: str, update: bool) -> None:
    """Compare `text` with tests/golden/NAME whole; `pytest --update-golden` rewrites it."""
    path = GOLDEN / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: run pytest --update-golden and review the diff"
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                str(path),
                "actual",
            )
        )
        raise AssertionError(f"output differs from {path} (pytest --update-golden):\n{diff}")
