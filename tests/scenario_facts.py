"""What a bundled scenario implies a user reads: who holds which device, and which held
devices stay idle. Derived from the scenario files through the scenario parsers (so the
defaults docs/simulation.md gives apply), never from an exporter's output; the acceptance
test (tests/test_kit_prometheus.py) compares dashboard panels with it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from simulator.nvml_scenario import parse_nvidia
from simulator.nvml_spec import NvidiaSpec
from simulator.scenario import Scenario, TimedPod
from simulator.signals import Signal


class Held(NamedTuple):
    pod: TimedPod
    container: str
    resource: str
    device_id: str


def holdings(scenario: Scenario) -> list[Held]:
    """Every (pod, container, resource, device ID) the scenario's kubelet hands out."""
    return [
        Held(timed, container.name, devices.resource_name, device_id)
        for timed in scenario.pods
        for container in timed.pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    ]


def nvidia_spec(scenario: Scenario) -> NvidiaSpec:
    return parse_nvidia(scenario.sections.get("nvidia") or {}, scenario.name)


def device_behind(device_id: str) -> str:
    """The device behind a plugin's ID: NVIDIA time-slicing hands out `UUID::N` replicas,
    the Intel GPU plugin `cardN-M` (M: the replica of its shared-dev-num)."""
    if "::" in device_id:
        return device_id.split("::", maxsplit=1)[0]
    m = re.fullmatch(r"(card\d+)-\d+", device_id)
    return m[1] if m else device_id


def utilization_signals(scenario: Scenario) -> dict[str, tuple[str, Signal]]:
    """Device (as `device_behind` names it) -> (its hw_id, the utilization the scenario
    gives it). NVIDIA whole GPUs and MIG slices by UUID; sysfs GPUs, whose busy percentage
    is a constant, by their plugins' IDs (AMD: the PCI address, hw_id its unique_id; Intel:
    `cardN`, hw_id its PCI address: docs/metrics.md). AMD partitions and NICs have none."""
    out = {}
    for gpu in nvidia_spec(scenario).gpus:
        if not gpu.mig:
            out[gpu.uuid] = (gpu.uuid, gpu.utilization)
        out |= {mig.uuid: (mig.uuid, mig.utilization) for mig in gpu.mig}
    sysfs = scenario.sections.get("sysfs") or {}
    for amd in sysfs.get("amdgpu", []):
        hw_id = str(amd.get("unique_id", amd["pci"]))
        out[amd["pci"]] = (hw_id, Signal.constant(amd["busy_percent"] / 100))
    for intel in sysfs.get("intel", []):
        out[f"card{intel['card']}"] = (intel["pci"], Signal.constant(intel["busy_percent"] / 100))
    return out


def range_while_held(signal: Signal, pod: TimedPod) -> tuple[float, float]:
    """(lowest, highest) a utilization signal reaches while `pod` lives: a number is itself;
    a square wave whose one high part spans the pod's whole life (the demo's short-job) is
    at its max; any other wave may be anywhere between its min and max."""
    if signal.pattern == "constant":
        return signal.max, signal.max
    if signal.pattern == "square" and pod.end is not None:
        into = (pod.start + signal.phase) % signal.period
        if into + pod.end - pod.start <= signal.duty * signal.period:
            return signal.max, signal.max
    return signal.min, signal.max


def idle_while_held(
    scenario: Scenario, threshold: float
) -> dict[tuple[str, ...], tuple[float, float]]:
    """(node, hw_id, namespace, pod) -> the utilization range of each held device whose
    utilization stays under `threshold` all the while its pod holds it. A device whose
    utilization crosses the threshold while held would make the answer depend on when the
    test looks: no bundled scenario has one, and this fails if one is added."""
    signals = utilization_signals(scenario)
    idle: dict[tuple[str, ...], tuple[float, float]] = {}
    for held in holdings(scenario):
        if device_behind(held.device_id) not in signals:
            continue
        hw_id, signal = signals[device_behind(held.device_id)]
        low, high = range_while_held(signal, held.pod)
        assert high < threshold or low >= threshold, (scenario.name, held.device_id, signal)
        if high < threshold:
            assert held.pod.end is None, f"{held.pod.pod.name} ends: its idle row would vanish"
            idle[scenario.node, hw_id, held.pod.pod.namespace, held.pod.pod.name] = (low, high)
    return idle
