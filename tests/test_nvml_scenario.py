"""The `nvidia:` scenario section: signals, validation, rendering, the bundled scenarios."""

from __future__ import annotations

import math

import pytest

from simulator.nvml_scenario import parse_nvidia
from simulator.nvml_spec import NO_ID
from simulator.nvml_state import render
from simulator.scenario import ScenarioError, load_scenario
from simulator.signals import Signal, parse_signal

GPU0 = "GPU-00000000-0000-4000-8000-000000000000"


def state(text: str) -> dict[str, list[str]]:
    """Rendered state -> {first word: [rest of line, ...]} of the top level and GPU 0."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("gpu 1"):
            break
        key, _, rest = line.partition(" ")
        out.setdefault(key, []).append(rest)
    return out


@pytest.mark.parametrize(
    "signal",
    [
        Signal("sine", 0.1, 0.9, 17, phase=3),
        Signal("square", 0.0, 1.0, 10, phase=4, duty=0.3),
        Signal("sawtooth", 0.2, 0.7, 7, phase=1),
        Signal.constant(0.4),
    ],
)
def test_signal_integrals_match_the_values(signal: Signal) -> None:
    step = 0.001
    numeric = sum(signal.value((i + 0.5) * step) for i in range(int(25 / step))) * step
    assert signal.integral(25.0) == pytest.approx(numeric, rel=1e-3)
    assert all(signal.min <= signal.value(t / 10) <= signal.max for t in range(300))


def test_signal_parse_errors_name_the_key() -> None:
    assert parse_signal(0.5, "x") == Signal.constant(0.5)
    assert parse_signal({"pattern": "constant", "min": 0.3}, "x") == Signal.constant(0.3)
    with pytest.raises(ValueError, match=r"u\.pattern: expected one of"):
        parse_signal({"pattern": "triangle"}, "u")
    with pytest.raises(ValueError, match=r"u\.period: must be positive"):
        parse_signal({"pattern": "sine", "period": 0}, "u")


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"gpus": [{"name": "x"}]}, r"nvidia\.gpus\[0\]: needs a uuid"),
        ({"gpus": [{"uuid": GPU0, "colour": 1}]}, r"nvidia\.gpus\[0\]: unknown keys \['colour'\]"),
        ({"gpus": [{"uuid": GPU0, "unsupported": ["fan"]}]}, r"unknown features \['fan'\]"),
        ({"gpus": [{"uuid": GPU0, "pci_bus_id": "zz"}]}, r"pci_bus_id: not a PCI address"),
        (
            {"gpus": [{"uuid": GPU0, "mig": [{"uuid": "GPU-1", "profile": "1g.10gb", "gi": 1}]}]},
            r"mig\[0\]\.uuid: must start with MIG-",
        ),
        ({"gpus": [{"uuid": GPU0}, {"uuid": GPU0}]}, r"UUIDs used twice"),
        ({"gpus": [{"uuid": GPU0}], "xid": [{"at": 1, "device": 3, "xid": 13}]}, r"no GPU with"),
        ({"gpus": [{"uuid": GPU0}], "faults": [{"kind": "meteor"}]}, r"faults\[0\]\.kind"),
    ],
)
def test_parse_errors_name_the_file_and_key(section: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as caught:
        parse_nvidia(section, "my.yaml")
    assert str(caught.value).startswith("my.yaml: ")


def test_volatile_counters_restart_when_the_driver_reloads() -> None:
    spec = parse_nvidia(
        {
            "gpus": [{"uuid": GPU0, "utilization": 0.5, "ecc_corrected_per_hour": 3600}],
            "faults": [{"kind": "driver_unloaded", "start": 10, "end": 20}],
        }
    )
    before, during, after = (state(render(spec, t, 0)) for t in (9.0, 15.0, 25.0))
    assert (before["loaded"], before["generation"]) == (["1"], ["0"])
    assert (during["loaded"], during["generation"]) == (["0"], ["0"])
    assert (after["loaded"], after["generation"]) == (["1"], ["1"])
    assert int(before["energy_mj"][0]) == 9 * 367500
    assert int(after["energy_mj"][0]) == 5 * 367500  # counted from the reload at t=20
    assert (before["ecc_corrected"], after["ecc_corrected"]) == (["9"], ["5"])


def test_a_lost_gpu_keeps_only_its_identity() -> None:
    spec = parse_nvidia(
        {"gpus": [{"uuid": GPU0}], "faults": [{"kind": "lost", "gpus": [GPU0], "start": 5}]}
    )
    lost = state(render(spec, 6.0, 0))
    assert lost["lost"] == ["1"]
    assert lost["uuid"] == [GPU0]
    assert "power_mw" not in lost


def test_mig_processes_carry_their_instance_ids() -> None:
    spec = parse_nvidia(
        {
            "gpus": [
                {
                    "uuid": GPU0,
                    "processes": [{"pid": 1, "memory": "1GiB", "end": 10}],
                    "mig": [
                        {
                            "uuid": "MIG-1",
                            "profile": "2g.20gb",
                            "gi": 5,
                            "ci": 1,
                            "processes": [{"pid": 2, "memory": 5}],
                        }
                    ],
                }
            ]
        }
    )
    early, late = state(render(spec, 1.0, 0)), state(render(spec, 11.0, 0))
    assert early["proc"] == [f"1 {2**30} {NO_ID} {NO_ID} 0 0", "2 5 5 1 0 0"]
    assert late["proc"] == ["2 5 5 1 0 0"]  # the first process ended at t=10
    assert "util_gpu" not in early  # MIG mode: no utilization counter


def test_the_dense_scenario_is_what_the_issue_asks_for() -> None:
    dense = load_scenario("dense")
    spec = parse_nvidia(dense.sections["nvidia"], "dense")
    assert len(spec.gpus) == 8
    assert [len(g.mig) for g in spec.gpus] == [7] * 6 + [0, 0]
    replicas = [i for d in dense.allocatable for i in d.device_ids if "::" in i]
    assert {i.split("::")[0] for i in replicas} == {spec.gpus[6].uuid, spec.gpus[7].uuid}
    pods = dense.pods_at(0.0)
    assert len(pods) == 200
    holding = [p for p in pods if any(c.devices for c in p.containers)]
    assert len(holding) < len(pods) / 2
    assert len(spec.xids) >= 3
    assert any(f.kind == "not_supported" for f in spec.faults)
    assert not math.isinf(max(x.at for x in spec.xids))
