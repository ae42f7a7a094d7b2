"""Absent is not broken: a sysfs class with no devices is success with zero devices, said
once; SR-IOV VF netlink reads default to on only in the host's network namespace."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from exporter.sources import SourceContext, registry
from exporter.sources.netdev import in_host_netns


@pytest.mark.parametrize(
    ("name", "looks_for"),
    [
        ("amdgpu", "class/drm cards bound to amdgpu"),
        ("intel", "class/drm cards bound to i915 or xe"),
        ("rdma", "InfiniBand/RDMA devices in class/infiniband"),
        ("netdev", "SR-IOV physical functions in class/net"),
    ],
)
def test_an_empty_sysfs_class_is_no_devices_said_once(
    name: str, looks_for: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "class").mkdir()
    logger = logging.getLogger(f"test.{name}")
    ctx = SourceContext(sysfs=tmp_path, logger=logger, options={"vf-netlink": "false"})
    source = registry()[name].factory(ctx)
    caplog.set_level(logging.INFO, logger=logger.name)
    for _ in range(3):
        result = source.collect()
        assert (result.readings, result.field_errors) == ((), 0)
        assert result.absent == f"no {looks_for} under {tmp_path}"
    said = [r.message for r in caplog.records if r.name == logger.name]
    assert said == [f"no {name} devices here: no {looks_for} under {tmp_path}"]


def fake_net(root: Path, interfaces: dict[str, int]) -> Path:
    for name, index in interfaces.items():
        (root / "class" / "net" / name).mkdir(parents=True)
        (root / "class" / "net" / name / "ifindex").write_text(f"{index}\n")
    return root


def test_host_netns_is_seen_when_sysfs_lists_our_own_interfaces(tmp_path: Path) -> None:
    ours = {name: index for index, name in socket.if_nameindex()}
    assert in_host_netns(fake_net(tmp_path / "same", ours))


def test_a_pod_netns_is_seen_when_the_host_has_other_interfaces(tmp_path: Path) -> None:
    ours = {name: index for index, name in socket.if_nameindex()}
    host = {**ours, "ens1f0": 90, "cali1234": 91}  # the host has more than this namespace
    assert not in_host_netns(fake_net(tmp_path / "host", host))
    assert not in_host_netns(tmp_path / "missing")


def test_vf_netlink_auto_is_off_outside_the_host_netns(tmp_path: Path) -> None:
    from exporter.sources.netdev import NetdevSource

    fake_net(tmp_path, {"lo": 1, "ens1f0": 90})
    source = NetdevSource(SourceContext(sysfs=tmp_path))
    assert source.vf_reader is None
    forced = NetdevSource(SourceContext(sysfs=tmp_path, options={"vf-netlink": "true"}))
    assert forced.vf_reader is not None
