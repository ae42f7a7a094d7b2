"""Simulated network devices in sysfs: InfiniBand HCAs with their ports and counters, and
SR-IOV NICs (PF, VFs, netdevs), with the PF's netlink VF-stats answer for VFs in pods.

A VF that the scenario puts in a pod (`in_pod: true`) has no netdev in the host tree, as
after the CNI moved it; its PF's netlink answer is recorded instead, encoded and decoded by
pyroute2 exactly as a live RTM_GETLINK answer is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.scenario import ScenarioError
from simulator.sysfslinks import link_windows
from simulator.sysfstree import Doc, Tree, pci_device

# --- InfiniBand ----------------------------------------------------------------------------

HCA_KEYS = {"name", "pci", "device_id", "hca_type", "fw_ver", "board_id", "netdev", "ports"}
PORT_KEYS = {
    "port", "state", "rate", "link_layer", "rx_gbps", "tx_gbps", "packet_bytes",
    "xmit_wait_per_s", "errors", "hw_counters", "down",
}  # fmt: skip
HCA_DEFAULTS = {"hca_type": "MT4123", "fw_ver": "20.39.1002", "board_id": "MT_0000000223"}
IB_STATES = {"DOWN": "1: DOWN", "INIT": "2: INIT", "ARMED": "3: ARMED", "ACTIVE": "4: ACTIVE"}
IB_ERROR_FILES = (
    "port_rcv_errors", "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_rcv_contraint_errors", "port_xmit_constraint_errors", "symbol_error", "link_downed",
    "link_error_recovery", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "VL15_dropped", "port_xmit_discards",
)  # fmt: skip


def render_hca(tree: Tree, hca: Doc, t: float) -> None:
    name = str(hca.get("name", "mlx5_0"))
    rel = pci_device(tree, hca.pci(), "0x15b3", hca.get("device_id", "0x101b"), "mlx5_core")
    ib = f"{rel}/infiniband/{name}"
    tree.link(f"class/infiniband/{name}", ib)
    tree.link(f"{ib}/device", rel)
    for key, default in HCA_DEFAULTS.items():
        tree.put(f"{ib}/{key}", hca.get(key, default))
    if hca.get("netdev"):
        _netdev(tree, rel, str(hca.get("netdev")), arp_type=32, speed=None, stats={})
    for port in hca.items("ports", PORT_KEYS):
        p = f"{ib}/ports/{int(port.number('port', 1))}"
        state = str(port.get("state", "ACTIVE"))
        if state not in IB_STATES:
            raise ScenarioError(f"{port.scenario}: {port.where}.state: one of {list(IB_STATES)}")
        state, downs = link_windows(port, t, state)  # sysfslinks.py: `down` windows
        tree.put(f"{p}/state", IB_STATES[state])
        tree.put(f"{p}/phys_state", "5: LinkUp" if state == "ACTIVE" else "3: Disabled")
        tree.put(f"{p}/rate", port.get("rate", "200 Gb/sec (4X HDR)"))
        tree.put(f"{p}/link_layer", port.get("link_layer", "InfiniBand"))
        packet = port.number("packet_bytes", 4096)
        for direction, key in (("rcv", "rx_gbps"), ("xmit", "tx_gbps")):
            octets = port.number(key) * 1e9 / 8 * t
            tree.put(f"{p}/counters/port_{direction}_data", int(octets / 4))  # ABI: octets / 4
            tree.put(f"{p}/counters/port_{direction}_packets", int(octets / packet))
        tree.put(f"{p}/counters/port_xmit_wait", int(port.number("xmit_wait_per_s") * t))
        errors = port.table("errors", dict.fromkeys(IB_ERROR_FILES))
        errors["link_downed"] = errors.get("link_downed", 0) + downs
        for file in IB_ERROR_FILES:
            tree.put(f"{p}/counters/{file}", int(errors.get(file, 0)))
        tree.put(f"{p}/hw_counters/lifespan", 10)
        for counter, value in port.table("hw_counters").items():
            tree.put(f"{p}/hw_counters/{counter}", int(value))


# --- SR-IOV NICs ---------------------------------------------------------------------------

PF_KEYS = {
    "pf", "pci", "driver", "vendor", "device_id", "speed_mbps", "rx_gbps", "tx_gbps",
    "vf_driver", "vf_device_id", "vfs",
}  # fmt: skip
VF_KEYS = {"pci", "ifname", "in_pod", "rx_gbps", "tx_gbps", "rx_dropped"}
FRAME_BYTES = 1500


def _traffic(doc: Doc, t: float) -> dict[str, int]:
    """Cumulative counters of an interface carrying `rx_gbps`/`tx_gbps` since t=0."""
    stats = {"rx_errors": 0, "tx_errors": 0, "tx_dropped": 0}
    for direction in ("rx", "tx"):
        octets = doc.number(f"{direction}_gbps") * 1e9 / 8 * t
        stats[f"{direction}_bytes"] = int(octets)
        stats[f"{direction}_packets"] = int(octets / FRAME_BYTES)
    stats["rx_dropped"] = int(doc.number("rx_dropped") * t)
    return stats


def _netdev(
    tree: Tree, pci: str, ifname: str, *, arp_type: int, speed: int | None, stats: Mapping[str, int]
) -> None:
    rel = f"{pci}/net/{ifname}"
    tree.link(f"class/net/{ifname}", rel)
    tree.link(f"{rel}/device", pci)
    tree.put(f"{rel}/type", arp_type)
    tree.put(f"{rel}/operstate", "up")
    if speed is not None:
        tree.put(f"{rel}/speed", speed)
    for key, value in stats.items():
        tree.put(f"{rel}/statistics/{key}", value)


def render_sriov(tree: Tree, pf: Doc, t: float, netlink: dict[str, list[dict[str, Any]]]) -> None:
    vendor = str(pf.get("vendor", "0x8086"))
    rel = pci_device(tree, pf.pci(), vendor, pf.get("device_id", "0x159b"), pf.get("driver", "ice"))
    ifname = str(pf.get("pf", "ens1f0"))
    speed = int(pf.number("speed_mbps", 100000))
    _netdev(tree, rel, ifname, arp_type=1, speed=speed, stats=_traffic(pf, t))
    vfs = list(pf.items("vfs", VF_KEYS))
    tree.put(f"{rel}/sriov_totalvfs", max(8, len(vfs)))
    tree.put(f"{rel}/sriov_numvfs", len(vfs))
    recorded = {}
    for index, vf in enumerate(vfs):
        vf_rel = pci_device(
            tree, vf.pci(), vendor, pf.get("vf_device_id", "0x1889"), pf.get("vf_driver", "iavf")
        )
        tree.link(f"{rel}/virtfn{index}", vf_rel)
        tree.link(f"{vf_rel}/physfn", rel)
        stats = _traffic(vf, t)
        recorded[index] = stats
        if vf.get("in_pod"):
            tree.dirs.add(f"{vf_rel}/net")  # the netdev lives in the pod's namespace now
        else:
            _netdev(
                tree,
                vf_rel,
                str(vf.get("ifname", f"{ifname}v{index}")),
                arp_type=1,
                speed=speed,
                stats=stats,
            )
    netlink[ifname] = [_netlink_answer(ifname, recorded)]


def _netlink_answer(pf: str, vfs: Mapping[int, Mapping[str, int]]) -> dict[str, Any]:
    """The RTM_NEWLINK answer for `ip link show dev PF` with VF stats, as pyroute2 decodes it."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    infos = []
    for index, stats in sorted(vfs.items()):
        counters = [
            ("IFLA_VF_STATS_RX_PACKETS", stats["rx_packets"]),
            ("IFLA_VF_STATS_TX_PACKETS", stats["tx_packets"]),
            ("IFLA_VF_STATS_RX_BYTES", stats["rx_bytes"]),
            ("IFLA_VF_STATS_TX_BYTES", stats["tx_bytes"]),
            ("IFLA_VF_STATS_BROADCAST", 0),
            ("IFLA_VF_STATS_MULTICAST", 0),
            ("IFLA_VF_STATS_RX_DROPPED", stats["rx_dropped"]),
            ("IFLA_VF_STATS_TX_DROPPED", stats["tx_dropped"]),
        ]
        mac = f"02:00:00:00:{index >> 8:02x}:{index & 0xFF:02x}"
        infos.append(
            (
                "IFLA_VF_INFO",
                {
                    "attrs": [
                        ("IFLA_VF_MAC", {"vf": index, "mac": mac}),
                        ("IFLA_VF_STATS", {"attrs": counters}),
                    ]
                },
            )
        )
    msg = ifinfmsg()
    msg["index"] = 1
    msg["attrs"] = [
        ("IFLA_IFNAME", pf),
        ("IFLA_NUM_VF", len(vfs)),
        ("IFLA_VFINFO_LIST", {"attrs": infos}),
    ]
    msg.encode()
    wire = ifinfmsg(msg.data)
    wire.decode()
    answer: dict[str, Any] = wire.dump()
    return answer
