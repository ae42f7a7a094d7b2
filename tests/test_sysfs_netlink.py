"""PF-side VF statistics: pyroute2's real decoding, a real kernel answer, the simulated
node's recorded replays (simulator/netlink.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError
from exporter.sources.netdev import NetdevSource, NetlinkVfStats, NetStats, parse_vf_stats
from simulator.netlink import RecordedVfStats, record_vf_stats
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario


def wire_answer(vfs: dict[int, list[tuple[str, int]]]) -> ifinfmsg:
    """An RTM_NEWLINK answer encoded to bytes and decoded back, as pyroute2 receives one."""
    msg = ifinfmsg()
    msg["index"] = 4
    infos = [
        (
            "IFLA_VF_INFO",
            {
                "attrs": [
                    ("IFLA_VF_MAC", {"vf": vf, "mac": "02:00:00:00:00:01"}),
                    ("IFLA_VF_STATS", {"attrs": counters}),
                ]
            },
        )
        for vf, counters in vfs.items()
    ]
    msg["attrs"] = [("IFLA_IFNAME", "ens1f0"), ("IFLA_VFINFO_LIST", {"attrs": infos})]
    msg.encode()
    decoded = ifinfmsg(msg.data)
    decoded.decode()
    return decoded


ANSWER = {
    0: [
        ("IFLA_VF_STATS_RX_PACKETS", 10),
        ("IFLA_VF_STATS_TX_PACKETS", 20),
        ("IFLA_VF_STATS_RX_BYTES", 2**40),
        ("IFLA_VF_STATS_TX_BYTES", 2000),
        ("IFLA_VF_STATS_RX_DROPPED", 3),
        ("IFLA_VF_STATS_TX_DROPPED", 4),
    ],
    # an older kernel: no dropped counters
    3: [
        ("IFLA_VF_STATS_RX_PACKETS", 1),
        ("IFLA_VF_STATS_TX_PACKETS", 2),
        ("IFLA_VF_STATS_RX_BYTES", 3),
        ("IFLA_VF_STATS_TX_BYTES", 4),
    ],
}
EXPECTED = {
    0: NetStats(
        rx_bytes=2**40, tx_bytes=2000, rx_packets=10, tx_packets=20, rx_dropped=3, tx_dropped=4
    ),
    3: NetStats(rx_bytes=3, tx_bytes=4, rx_packets=1, tx_packets=2),
}


def test_parses_pyroute2_messages_and_their_dicts() -> None:
    message = wire_answer(ANSWER)
    assert parse_vf_stats([message]) == EXPECTED
    assert parse_vf_stats([json.loads(json.dumps(message.dump()))]) == EXPECTED


def test_an_answer_without_vfs_is_empty() -> None:
    assert parse_vf_stats([wire_answer({})]) == {}


def test_the_real_kernel_answers_for_an_interface_without_vfs() -> None:
    """A real RTM_GETLINK with RTEXT_FILTER_VF against this machine's loopback."""
    assert NetlinkVfStats().vf_stats("lo") == {}


def test_the_real_kernel_refuses_an_unknown_pf() -> None:
    with pytest.raises(NetlinkError):
        NetlinkVfStats().vf_stats("no-such-pf0")


def test_record_and_replay(tmp_path: Path) -> None:
    recorded = record_vf_stats(["lo"])
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(recorded))
    assert RecordedVfStats(path).vf_stats("lo") == {}
    path.write_text(json.dumps({"ens1f0": [wire_answer(ANSWER).dump()]}))
    assert RecordedVfStats(path).vf_stats("ens1f0") == EXPECTED
    with pytest.raises(LookupError):
        RecordedVfStats(path).vf_stats("ens9f9")


def test_the_simulated_node_answers_pf_netlink_through_no_exporter_flag(tmp_path: Path) -> None:
    """The recorded answers reach the netdev source through the simulator's own seam
    (`SimulatedNode.sources`), which keeps `--collector.netdev.vf-netlink false`; the product
    has no flag that names a recording."""
    node = SimulatedNode(load_scenario("mixed"), tmp_path / "node")
    args = [*node.exporter_args(), "--no-collector.nvml"]
    assert not [a for a in args if "netlink" in a]
    netdev = node.sources(parse_config(args, env={}))["netdev"]
    assert isinstance(netdev, NetdevSource) and isinstance(netdev.vf_reader, RecordedVfStats)
    moved = [r for r in netdev.collect().readings if r.device.id == "0000:5e:01.0"]
    assert [("hw.network.stats_source", "pf_netlink") in r.device.attributes for r in moved] == [
        True
    ]
    off = parse_config([*args, "--collector.netdev.vf-netlink", "false"], env={})
    off_netdev = node.sources(off)["netdev"]
    assert isinstance(off_netdev, NetdevSource) and off_netdev.vf_reader is None
    with pytest.raises(UsageError, match="netlink-replay"):
        parse_config([*args, "--collector.netdev.netlink-replay", str(node.workdir)], env={})
