"""Metric groups (issue 27 item 5): the default carries no more series per non-MIG GPU than
dcgm-exporter's default counters, and still answers the first questions; the rest is one
flag away, and the flags, the chart and the kit say so."""

from __future__ import annotations

import ctypes
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from exporter.cli.flags import parse_config
from exporter.cli.parser import env_name
from exporter.derive.budget import Budget
from exporter.metrics import SPECS
from exporter.model import Snapshot
from exporter.settings.table import CORE, DEFAULT_GROUPS, GROUP_NAMES, GROUPS
from monitoring.groups import groups_read
from tests.nvml_support import fakenvml  # noqa: F401 - fixture
from tests.support import metrics_text
from tests.support.simulated_node import scenario_snapshot

REPO = Path(__file__).resolve().parent.parent
DCGM_DEFAULTS = Path(__file__).parent / "data" / "dcgm-exporter-default-counters.csv"


def dcgm_default_series() -> list[str]:
    """dcgm-exporter's default fields that are series (a `label` field is a label on them)."""
    fields = []
    for line in DCGM_DEFAULTS.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, kind = (part.strip() for part in line.split(",")[:2])
        if kind != "label":
            fields.append(name)
    return fields


def per_gpu(text: str, gpu: str) -> list[str]:
    """Every series that carries the GPU's hw_id: its own, its allocations, its health."""
    return [
        line for line in text.splitlines() if not line.startswith("#") and f'hw_id="{gpu}"' in line
    ]


def whole_gpus(text: str) -> list[str]:
    """The non-MIG GPUs: hw_info of a GPU no MIG slice names as parent, and no slice itself."""
    infos = [line for line in text.splitlines() if line.startswith("hw_info{")]
    parents = set(re.findall(r'hw_parent="([^"]+)"', "\n".join(infos)))
    gpus = []
    for line in infos:
        uuid = re.search(r'hw_id="([^"]+)"', line)
        whole = uuid and 'hw_type="gpu"' in line and "hw_gpu_mig_profile" not in line
        if uuid and whole and uuid.group(1) not in parents:
            gpus.append(uuid.group(1))
    return gpus


@pytest.fixture
async def dense(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Snapshot:
    return await scenario_snapshot("dense", tmp_path, monkeypatch)


def test_dcgm_exporters_defaults_are_25_series() -> None:
    fields = dcgm_default_series()
    assert len(fields) == 25
    assert "DCGM_FI_DEV_GPU_UTIL" in fields and "DCGM_FI_DRIVER_VERSION" not in fields


async def test_default_series_per_whole_gpu_within_dcgm_exporters_defaults(
    dense: Snapshot,
) -> None:
    """dcgm-exporter's default counters are series of the GPU: 25 whatever runs on it. Ours
    are compared the same way, the series of the GPU itself; the series of each container
    holding it (its allocation, its energy, its own use of the GPU from process
    attribution) come on top, a fixed few per holder, where dcgm-exporter has no per-holder
    series at all (it puts one pod's labels on the GPU's series)."""
    limit = len(dcgm_default_series())
    default = metrics_text(Budget().apply(dense))
    everything = metrics_text(Budget(groups=frozenset(GROUP_NAMES)).apply(dense))
    gpus = whole_gpus(default)
    assert len(gpus) == 2  # dense: GPUs 6 and 7, each time-sliced to 3 pods
    own = {gpu: [s for s in per_gpu(default, gpu) if "k8s_pod_name=" not in s] for gpu in gpus}
    assert max(len(series) for series in own.values()) <= limit, own
    # the same GPUs with every group on: the test can fail
    assert (
        min(len([s for s in per_gpu(everything, g) if "k8s_pod_name=" not in s]) for g in gpus)
        > limit
    )
    for gpu in gpus:
        holders = [s for s in per_gpu(default, gpu) if "k8s_pod_name=" in s]
        per_holder = Counter(
            re.search(r'k8s_pod_name="([^"]+)"', s).group(1)  # type: ignore[union-attr]
            for s in holders
        )
        assert len(per_holder) == 3 and max(per_holder.values()) <= 5, per_holder
        series = "\n".join(per_gpu(default, gpu))
        for family in (
            'hw_gpu_utilization_ratio{hw_gpu_task="general"',
            "hw_gpu_memory_usage_bytes{",
            "hw_gpu_memory_limit_bytes{",
            "hw_power_watts{",
            'hw_temperature_celsius{hw_id="',
            'hw_errors_total{error_type="ecc_uncorrected"',
            "hw_gpu_memory_row_remap_pending{",
            'hw_status{hw_id="',
            "hw_allocation_info{",
            'hw_gpu_clock_throttled{hw_gpu_clock_throttle_reason="hw_thermal_slowdown"',
        ):
            assert family in series, (gpu, family)
        assert "hw_gpu_clock_hertz" not in series  # the clocks group is off


async def test_a_group_flag_brings_its_series_back(dense: Snapshot) -> None:
    config = parse_config(["--metrics.group.clocks", "--metrics.group.interconnect"], env={})
    assert config.metric_groups == {CORE, "clocks", "interconnect"}
    text = metrics_text(Budget(groups=config.metric_groups).apply(dense))
    assert "hw_gpu_clock_hertz{" in text
    assert 'hw_gpu_clock_throttled{hw_gpu_clock_throttle_reason="gpu_idle"' in text
    assert 'error_type="nvlink_crc"' in text and "hw_gpu_nvlink_io_bytes_total{" in text
    assert "hw_gpu_memory_free_bytes{" not in text  # memory: still off
    assert 'kube_device_exporter_metric_group_enabled{group="clocks"' in text
    on = re.findall(r'metric_group_enabled\{group="(\w+)"[^}]*\} 1', text)
    assert sorted(on) == ["clocks", "core", "interconnect"]


def test_group_flags_and_variables() -> None:
    assert parse_config([], env={}).metric_groups == DEFAULT_GROUPS == {CORE}
    env = {"KDE_METRICS_GROUP_MEMORY": "true"}
    assert parse_config([], env=env).metric_groups == {CORE, "memory"}
    assert parse_config(["--no-metrics.group.memory"], env=env).metric_groups == {CORE}
    every = [f"--metrics.group.{g.name}" for g in GROUPS if g.name != CORE]
    assert parse_config(every, env={}).metric_groups == set(GROUP_NAMES)


def test_every_group_is_known_and_used() -> None:
    used = {spec.group for spec in SPECS.values()}
    used |= {group for spec in SPECS.values() for _, _, group in spec.value_groups}
    assert used == set(GROUP_NAMES)


def test_the_chart_and_the_kit_expose_every_group() -> None:
    values = yaml.safe_load((REPO / "deploy/helm/kube-device-exporter/values.yaml").read_text())
    assert set(values["metricGroups"]) == set(GROUP_NAMES) - {CORE}
    assert not any(values["metricGroups"].values())  # off by default, as the exporter
    kit = (REPO / "deploy/components/metric-groups/kustomization.yaml").read_text()
    for group in GROUP_NAMES:
        if group != CORE:
            assert f'{{name: {env_name(f"--metrics.group.{group}")}, value: "true"}}' in kit


def test_every_alert_reads_only_the_default_set() -> None:
    """The alerts keep working without a group flag: no expression needs an opt-in group."""
    from monitoring.alerts import GROUPS as ALERT_GROUPS

    for alert in (a for alerts in ALERT_GROUPS.values() for a in alerts):
        needed, _ = groups_read([alert.expr])
        assert needed == set(), (alert.name, needed)


def test_panels_that_need_a_group_say_so_on_their_face() -> None:
    assert groups_read(['rate(hw.gpu.io{hw.id="x"}[5m])']) == ({"interconnect"}, set())
    assert groups_read(['hw.errors{error.type="nvlink_crc"}']) == ({"interconnect"}, set())
    assert groups_read(['hw.errors{error.type="ecc_uncorrected"}']) == (set(), set())
    assert groups_read(["hw.errors"]) == (set(), {"interconnect", "memory"})
    assert groups_read(['hw.gpu.clock.throttled{hw.gpu.clock.throttle_reason=~".*thermal.*"}']) == (
        set(),
        set(),
    )
    titles: dict[str, str] = {}
    for path in (REPO / "dashboards").glob("*.json"):
        for panel in json.loads(path.read_text()).get("panels", []):
            titles[panel["title"]] = panel.get("description", "")
    assert "Needs `--metrics.group.clocks`" in titles["Clocks (opt-in: clocks)"]
    assert "NVLink throughput (opt-in: interconnect)" in titles
    assert "More series with `--metrics.group.clocks`" in titles["Power and limit"]
    assert not any("opt-in" in t for t in titles if t.startswith("Utilization"))


@pytest.mark.peer
def test_the_chart_and_the_kit_turn_groups_on(tmp_path: Path) -> None:
    """What the chart's `metricGroups` and the kit's component render, read back by the
    exporter's own flag parser."""
    from tests.support.manifests import kit_with, one, render_chart

    rendered = render_chart({"metricGroups": {"clocks": True, "memory": True}})
    [container] = one(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    groups = parse_config(container.get("args", []), env={}).metric_groups
    assert groups == {CORE, "clocks", "memory"}
    kit = kit_with(tmp_path, "kube-prometheus-stack", "metric-groups")
    [container] = one(kit, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert parse_config([], env=env).metric_groups == set(GROUP_NAMES)


async def test_the_dcgm_schema_flag_alone_serves_dcgm_exporters_default_counters(
    dense: Snapshot,
) -> None:
    """`--metrics.schema=dcgm` and nothing else (what the README tells a dcgm-exporter user
    to set) serves every counter of its etc/default-counters.csv that NVML can give (what
    every group on gives) on the dense node's H100s; the sink's list is that file's. A group
    named by its flag still wins."""
    from exporter.sinks.dcgm import DEFAULT_COUNTERS, FIELDS

    assert list(DEFAULT_COUNTERS) == dcgm_default_series()
    served = [name for name in DEFAULT_COUNTERS if name in {f.spec.name for f in FIELDS}]
    assert set(DEFAULT_COUNTERS) - set(served) == {
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",  # per link: hw_gpu_nvlink_io_bytes_total
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",  # vGPU guests
    }

    def families(*flags: str) -> set[str]:
        config = parse_config(list(flags), env={})
        text = metrics_text(Budget(groups=config.metric_groups).apply(dense), ("dcgm",))
        return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}

    alone = families("--metrics.schema=dcgm")
    every = families(
        "--metrics.schema=dcgm", *(f"--metrics.group.{g}" for g in GROUP_NAMES if g != CORE)
    )
    nvml_gives = [name for name in served if name in every]
    assert set(served) - set(nvml_gives) == {"DCGM_FI_DEV_ENC_UTIL"}  # H100: no NVENC
    assert [name for name in nvml_gives if name not in alone] == []
    # the native default alone (core) left these out before: the test can fail
    core_only = metrics_text(Budget().apply(dense), ("dcgm",))
    assert "DCGM_FI_DEV_SM_CLOCK" not in core_only
    assert "DCGM_FI_DEV_SM_CLOCK" not in families(
        "--metrics.schema=dcgm", "--no-metrics.group.clocks"
    )
    env = parse_config([], env={"KDE_METRICS_SCHEMA": "dcgm"})
    assert env.metric_groups == parse_config(["--metrics.schema=dcgm"], env={}).metric_groups
