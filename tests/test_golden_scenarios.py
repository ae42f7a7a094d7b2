"""Whole /metrics of every bundled scenario, compared with tests/golden/; promtool lints those
files (the `peer` tests).

The real sources (NVML through nvidia-ml-py and the simulated library, the sysfs sources
over the rendered tree) run against the simulated node at fixed scenario times with frozen
clocks, so the output is reproducible byte for byte. `pytest --update-golden` rewrites.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from exporter.ids import ResourceMatcher
from exporter.metrics import Kind
from exporter.sinks.dcgm import FIELDS
from simulator.scenario import Scenario, bundled_names, load_scenario
from tests.nvml_support import fakenvml  # noqa: F401 - fixture
from tests.peers import promtool_check_metrics
from tests.support import GOLDEN, assert_golden, metrics_text
from tests.support.simulated_node import T1, scenario_snapshot


def test_every_bundled_scenario_has_a_golden_file() -> None:
    goldens = {p.stem.removeprefix("scenario-") for p in GOLDEN.glob("scenario-*.prom")}
    assert set(bundled_names()) <= goldens, "run pytest --update-golden for the new scenario"
    assert goldens <= set(bundled_names()) | {f"{n}-dcgm" for n in bundled_names()}


@pytest.mark.parametrize("name", sorted(bundled_names()))
async def test_golden_metrics(
    name: str,
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    update_golden: bool,
) -> None:
    snapshot = await scenario_snapshot(name, tmp_path, monkeypatch)
    text = metrics_text(snapshot)
    _assert_what_the_scenario_says(load_scenario(name), text)
    assert_golden(f"scenario-{name}.prom", text, update_golden)


@pytest.mark.peer
@pytest.mark.parametrize("name", sorted(bundled_names()))
def test_golden_metrics_pass_promtool(name: str) -> None:
    """promtool lints the file test_golden_metrics holds the output to, byte for byte."""
    promtool_check_metrics((GOLDEN / f"scenario-{name}.prom").read_text())


async def test_golden_dense_in_dcgm_schema(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    update_golden: bool,
) -> None:
    snapshot = await scenario_snapshot("dense", tmp_path, monkeypatch)
    text = metrics_text(snapshot, schema=("dcgm",))
    assert_golden("scenario-dense-dcgm.prom", text, update_golden)
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in _dcgm_families(text)[1]


def _dcgm_families(text: str) -> tuple[set[str], set[str]]:
    """The DCGM_ families of a dcgm-schema output, and those of them that are counters."""
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE DCGM_")}
    return families, {f.spec.name for f in FIELDS if f.spec.kind is Kind.COUNTER} & families


@pytest.mark.peer
def test_golden_dense_in_dcgm_schema_lints_as_dcgm_exporter_names() -> None:
    """dcgm-exporter's names are the point: its counters have no `_total` and its labels
    are camelCase (`modelName`, `UUID`, `Hostname`). promtool's lint on the golden file
    (the output, byte for byte) says exactly that, for exactly its families, and nothing
    else."""
    text = (GOLDEN / "scenario-dense-dcgm.prom").read_text()
    families, counters = _dcgm_families(text)
    camel = "label names should be written in 'snake_case' not 'camelCase'"
    promtool_check_metrics(
        text,
        lint=[f'{c} counter metrics should have "_total" suffix' for c in counters]
        + [f"{name} {camel}" for name in families]
        + ["DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'"],
    )


def _value(text: str, family: str, **labels: str) -> float | None:
    """The value of the one series of `family` carrying every label given."""
    found = []
    for line in text.splitlines():
        if not line.startswith(family + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            found.append(float(line.rsplit(" ", 1)[1]))
    assert len(found) <= 1, f"{family} {labels}: {found}"
    return found[0] if found else None


def _assert_what_the_scenario_says(scenario: Scenario, text: str) -> None:
    """Values read off the scenario file, not off the exporter: a golden file blessed with
    a wrong number still fails here."""
    matcher = ResourceMatcher()
    allocatable: dict[str, int] = {}
    for devs in scenario.allocatable_at(T1):
        if matcher(devs.resource_name):
            allocatable[devs.resource_name] = allocatable.get(devs.resource_name, 0) + len(
                devs.device_ids
            )
    held: dict[str, int] = {}
    for pod in scenario.pods_at(T1):
        for container in pod.containers:
            for devs in container.devices:
                if matcher(devs.resource_name):
                    held[devs.resource_name] = held.get(devs.resource_name, 0) + len(
                        devs.device_ids
                    )
    for resource, count in allocatable.items():
        r = {"hw_allocation_resource": resource}
        assert _value(text, "hw_allocatable_devices", **r) == count, resource
        assert _value(text, "kube_device_exporter_devices_unseen", **r) == 0, resource
    for resource, count in held.items():
        assert _value(text, "hw_allocated_devices", hw_allocation_resource=resource) == count
    for pod in scenario.pods_at(T1):
        for container in pod.containers:
            for devs in container.devices:
                if not matcher(devs.resource_name):
                    continue
                for raw in devs.device_ids:
                    labels = {
                        "k8s_pod_name": pod.name,
                        "k8s_container_name": container.name,
                        "hw_allocation_device_id": raw,
                    }
                    assert _value(text, "hw_allocation_info", **labels) == 1.0, labels
