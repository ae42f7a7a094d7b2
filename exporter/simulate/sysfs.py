"""The simulated sysfs: AMD and Intel GPUs, InfiniBand HCAs and SR-IOV NICs as files.

Renders the scenario's `sysfs:` section (docs/simulation.md) into a tree with the kernel's
real layout, symlinks included: `class/drm/cardN -> ../../devices/pci.../drm/cardN`,
`bus/pci/devices/<BDF>`, `driver` links, hwmon chips, the KFD topology, IB ports,
netdevs, `virtfnN`/`physfn`. Counters grow with scenario time (`advance(t)`), written
by rename so a reader never sees half a file. The tests build their fixture trees with
this same renderer, so fixtures and simulator cannot drift apart.

A VF that the scenario puts in a pod (`in_pod: true`) has no netdev in the host tree, as
after the CNI moved it; its PF's netlink answer is recorded to a JSON file instead,
encoded and decoded by pyroute2 exactly as a live RTM_GETLINK answer is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.join import pci_address
from exporter.simulate.scenario import Scenario, ScenarioError

SECTION_KEYS = {"amdgpu", "intel", "infiniband", "rdma_pools", "sriov", "numa_nodes"}
GIB = 1024**3


class _Doc:
    """A mapping from the scenario with the key path kept for error messages."""

    def __init__(self, scenario: str, where: str, value: Any, allowed: set[str]) -> None:
        if not isinstance(value, Mapping):
            raise ScenarioError(f"{scenario}: {where}: expected a mapping")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ScenarioError(f"{scenario}: {where}: unknown keys {unknown}")
        self.scenario, self.where, self.value = scenario, where, value

    def get(self, key: str, default: Any = None) -> Any:
        return self.value.get(key, default)

    def number(self, key: str, default: float = 0.0) -> float:
        value = self.value.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScenarioError(f"{self.scenario}: {self.where}.{key}: expected a number")
        return float(value)

    def table(self, key: str, allowed: Mapping[str, object] | None = None) -> dict[str, float]:
        """A `{name: number}` mapping (temperatures by label, counters by file name)."""
        value = self.value.get(key) or {}
        where = f"{self.scenario}: {self.where}.{key}"
        if not isinstance(value, Mapping):
            raise ScenarioError(f"{where}: expected a mapping")
        for name, number in value.items():
            if allowed is not None and name not in allowed:
                raise ScenarioError(f"{where}: unknown {name!r} (allowed: {sorted(allowed)})")
            if isinstance(number, bool) or not isinstance(number, int | float):
                raise ScenarioError(f"{where}.{name}: expected a number")
        return {str(k): float(v) for k, v in value.items()}

    def pci(self, key: str = "pci") -> str:
        address = pci_address(str(self.value.get(key, "")))
        if address is None:
            raise ScenarioError(f"{self.scenario}: {self.where}.{key}: expected a PCI address")
        return address

    def items(self, key: str, allowed: set[str]) -> Iterator[_Doc]:
        value = self.value.get(key) or []
        if not isinstance(value, list):
            raise ScenarioError(f"{self.scenario}: {self.where}.{key}: expected a list")
        for i, item in enumerate(value):
            yield _Doc(self.scenario, f"{self.where}.{key}[{i}]", item, allowed)


@dataclass
class Tree:
    """Files, links and empty directories of a sysfs tree at one moment."""

    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    """link path -> target path, both relative to the root (made relative on disk)."""
    dirs: set[str] = field(default_factory=set)

    def put(self, rel: str, value: object) -> None:
        self.files[rel] = f"{value}\n"

    def link(self, rel: str, target: str) -> None:
        self.links[rel] = target


def pci_dir(address: str) -> str:
    """`devices/pci0000:00/0000:00:<n>.0/<BDF>`: each bus behind a root port of its own."""
    domain, bus = address[:4], int(address[5:7], 16)
    return f"devices/pci{domain}:00/{domain}:00:{bus & 0x1F:02x}.0/{address}"


def _pci_device(tree: Tree, address: str, vendor: str, device: str, driver: str) -> str:
    rel = pci_dir(address)
    tree.put(f"{rel}/vendor", vendor)
    tree.put(f"{rel}/device", device)
    tree.put(f"{rel}/numa_node", 0)
    if driver:
        tree.dirs.add(f"bus/pci/drivers/{driver}")
        tree.link(f"{rel}/driver", f"bus/pci/drivers/{driver}")
        tree.link(f"bus/pci/drivers/{driver}/{address}", rel)
    tree.link(f"bus/pci/devices/{address}", rel)
    return rel


class _Numbers:
    """Hands out DRM card and render minors and hwmon indices in order, as the kernel does."""

    def __init__(self, first_card: int) -> None:
        self.counters = {"card": first_card, "render": 128, "hwmon": 0}

    def next(self, kind: str) -> int:
        self.counters[kind] += 1
        return self.counters[kind] - 1


def _drm(tree: Tree, parent: str, card: int, render: int) -> None:
    for name in (f"card{card}", f"renderD{render}"):
        tree.put(f"{parent}/drm/{name}/dev", f"226:{card if name.startswith('card') else render}")
        tree.link(f"{parent}/drm/{name}/device", parent)
        tree.link(f"class/drm/{name}", f"{parent}/drm/{name}")


def _hwmon(tree: Tree, parent: str, index: int, name: str, values: Mapping[str, object]) -> None:
    rel = f"{parent}/hwmon/hwmon{index}"
    tree.put(f"{rel}/name", name)
    tree.link(f"{rel}/device", parent)
    tree.link(f"class/hwmon/hwmon{index}", rel)
    for key, value in values.items():
        tree.put(f"{rel}/{key}", value)


# --- AMD -----------------------------------------------------------------------------------

AMD_KEYS = {
    "pci", "card", "unique_id", "product", "serial", "device_id", "busy_percent",
    "mem_busy_percent", "vram_gib", "vram_used_gib", "vis_vram_gib", "vis_vram_used_gib",
    "gtt_gib", "gtt_used_gib", "power_w", "power_file", "power_cap_w", "temperature_c",
    "clock_mhz", "pcie_replays", "ras", "partition_mode", "partitions",
}  # fmt: skip
TEMPERATURE_CHANNELS = {"edge": 1, "junction": 2, "mem": 3}
XE_TEMPERATURE_CHANNELS = {"pkg": 2, "vram": 3}
CLOCK_CHANNELS = {"sclk": 1, "mclk": 2}
KFD = "devices/virtual/kfd/kfd"


def _amdgpu(tree: Tree, gpu: _Doc, numbers: _Numbers, kfd: list[dict[str, int]]) -> None:
    address = gpu.pci()
    rel = _pci_device(tree, address, "0x1002", gpu.get("device_id", "0x74a1"), "amdgpu")
    render = numbers.next("render")
    _drm(tree, rel, int(gpu.number("card")), render)
    for key, file in (
        ("unique_id", "unique_id"),
        ("product", "product_name"),
        ("serial", "serial_number"),
    ):
        if gpu.get(key) is not None:
            tree.put(f"{rel}/{file}", gpu.get(key))
    tree.put(f"{rel}/gpu_busy_percent", int(gpu.number("busy_percent")))
    tree.put(f"{rel}/mem_busy_percent", int(gpu.number("mem_busy_percent")))
    for name in ("vram", "vis_vram", "gtt"):
        tree.put(f"{rel}/mem_info_{name}_total", int(gpu.number(f"{name}_gib") * GIB))
        tree.put(f"{rel}/mem_info_{name}_used", int(gpu.number(f"{name}_used_gib") * GIB))
    tree.put(f"{rel}/pcie_replay_count", int(gpu.number("pcie_replays")))
    for block, counts in (gpu.get("ras") or {}).items():
        tree.put(
            f"{rel}/ras/{block}_err_count", "\n".join(f"{k}: {int(v)}" for k, v in counts.items())
        )
    hwmon: dict[str, object] = {
        gpu.get("power_file", "power1_average"): round(gpu.number("power_w") * 1e6),
        "power1_cap": round(gpu.number("power_cap_w") * 1e6),
    }
    _labelled(
        hwmon, "temp", gpu.table("temperature_c", TEMPERATURE_CHANNELS), TEMPERATURE_CHANNELS, 1000
    )
    _labelled(hwmon, "freq", gpu.table("clock_mhz", CLOCK_CHANNELS), CLOCK_CHANNELS, 1e6)
    _hwmon(tree, rel, numbers.next("hwmon"), "amdgpu", hwmon)
    # Partitions: the GPU's own card is partition 0, the others are amdgpu_xcp_N platform
    # devices. The KFD topology ties every render node to the GPU's PCI address.
    partitions = [int(p) for p in gpu.get("partitions") or []]
    tree.put(f"{rel}/current_compute_partition", gpu.get("partition_mode", "SPX"))
    bus, slot, fn = int(address[5:7], 16), int(address[8:10], 16), int(address[11])
    share = len(partitions) + 1
    memory = {
        "location": bus << 8 | slot << 3 | fn,
        "size": int(gpu.number("vram_gib") * GIB) // share,
        "used": int(gpu.number("vram_used_gib") * GIB) // share,
    }
    kfd.append({"render": render, **memory})
    for xcp in partitions:
        minor = numbers.next("render")
        _drm(tree, f"devices/platform/amdgpu_xcp_{xcp}", numbers.next("card"), minor)
        kfd.append({"render": minor, **memory})


def _labelled(
    hwmon: dict[str, object],
    kind: str,
    values: Mapping[str, float],
    channels: Mapping[str, int],
    scale: float,
) -> None:
    """hwmon `<kind>N_input` (value * scale) and `<kind>N_label` pairs, N from the label."""
    for label, value in values.items():
        hwmon[f"{kind}{channels[label]}_input"] = round(value * scale)
        hwmon[f"{kind}{channels[label]}_label"] = label


def _kfd(tree: Tree, nodes: list[dict[str, int]]) -> None:
    """KFD topology: node 0 the CPU, then one node per GPU render node."""
    tree.link("class/kfd/kfd", KFD)
    tree.put(
        f"{KFD}/topology/nodes/0/properties", "cpu_cores_count 64\nsimd_count 0\ndrm_render_minor 0"
    )
    for i, node in enumerate(nodes, start=1):
        rel = f"{KFD}/topology/nodes/{i}"
        tree.put(
            f"{rel}/properties",
            f"cpu_cores_count 0\nsimd_count 304\nlocation_id {node['location']}\n"
            f"drm_render_minor {node['render']}\ndomain 0",
        )
        # gpu_id: what KFD's per-process files (`proc/<pid>/vram_<gpu_id>`) are named by; a
        # real one is a hash of the device's properties (kfd_topology.c), any number here.
        tree.put(f"{rel}/gpu_id", 40000 + 97 * i)
        tree.put(f"{rel}/mem_banks/0/properties", f"heap_type 1\nsize_in_bytes {node['size']}")
        tree.put(f"{rel}/mem_banks/0/used_memory", node["used"])


# --- Intel ---------------------------------------------------------------------------------

INTEL_KEYS = {
    "pci", "card", "driver", "device_id", "gts", "media_gt", "freq_mhz", "busy_percent",
    "power_w", "energy_j", "power_max_w", "temperature_c",
}  # fmt: skip


def _intel(tree: Tree, gpu: _Doc, numbers: _Numbers, t: float) -> None:
    driver = gpu.get("driver", "i915")
    if driver not in ("i915", "xe"):
        raise ScenarioError(f"{gpu.scenario}: {gpu.where}.driver: i915 or xe, got {driver!r}")
    rel = _pci_device(tree, gpu.pci(), "0x8086", gpu.get("device_id", "0x56c0"), driver)
    card = int(gpu.number("card"))
    _drm(tree, rel, card, numbers.next("render"))
    mhz = int(gpu.number("freq_mhz"))
    idle_ms = round((1 - gpu.number("busy_percent") / 100) * t * 1000)
    gt_ids = iter(range(64))  # xe numbers GTs across tiles: tile0/gt0, tile0/gt1, tile1/gt2...
    for tile in range(int(gpu.number("gts", 1))):
        if driver == "i915":
            base = f"{rel}/drm/card{card}/gt/gt{tile}"
            tree.put(f"{base}/rps_act_freq_mhz", mhz)
            tree.put(f"{base}/rps_cur_freq_mhz", mhz)
            tree.put(f"{base}/rc6_residency_ms", idle_ms)
            continue
        _xe_gt(tree, f"{rel}/tile{tile}/gt{next(gt_ids)}", "rc", mhz, idle_ms)
        if gpu.get("media_gt"):
            # The media GT idles most of the time; the exporter must leave it out.
            _xe_gt(tree, f"{rel}/tile{tile}/gt{next(gt_ids)}", "mc", 500, int(t * 1000))
    if driver == "i915":
        tree.put(f"{rel}/drm/card{card}/gt_act_freq_mhz", mhz)
    energy_uj = round((gpu.number("energy_j") + gpu.number("power_w") * t) * 1e6)
    hwmon: dict[str, object] = {
        "energy1_input": energy_uj,
        "power1_max": round(gpu.number("power_max_w") * 1e6),
    }
    if driver == "xe":
        hwmon |= {"energy1_label": "card", "power1_label": "card"}
        hwmon |= {"energy2_input": energy_uj + 7_000_000, "energy2_label": "pkg"}
        temps = gpu.table("temperature_c", XE_TEMPERATURE_CHANNELS)
        _labelled(hwmon, "temp", temps, XE_TEMPERATURE_CHANNELS, 1000)
    _hwmon(tree, rel, numbers.next("hwmon"), driver, hwmon)


def _xe_gt(tree: Tree, rel: str, kind: str, mhz: int, idle_ms: int) -> None:
    tree.put(f"{rel}/freq0/act_freq", mhz)
    tree.put(f"{rel}/gtidle/idle_residency_ms", idle_ms)
    tree.put(f"{rel}/gtidle/name", f"{rel.rsplit('/', 1)[1]}-{kind}")


# --- InfiniBand ----------------------------------------------------------------------------

HCA_KEYS = {"name", "pci", "device_id", "hca_type", "fw_ver", "board_id", "netdev", "ports"}
PORT_KEYS = {
    "port", "state", "rate", "link_layer", "rx_gbps", "tx_gbps", "packet_bytes",
    "xmit_wait_per_s", "errors", "hw_counters",
}  # fmt: skip
HCA_DEFAULTS = {"hca_type": "MT4123", "fw_ver": "20.39.1002", "board_id": "MT_0000000223"}
IB_STATES = {"DOWN": "1: DOWN", "INIT": "2: INIT", "ARMED": "3: ARMED", "ACTIVE": "4: ACTIVE"}
IB_ERROR_FILES = (
    "port_rcv_errors", "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_rcv_contraint_errors", "port_xmit_constraint_errors", "symbol_error", "link_downed",
    "link_error_recovery", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "VL15_dropped", "port_xmit_discards",
)  # fmt: skip


def _hca(tree: Tree, hca: _Doc, t: float) -> None:
    name = str(hca.get("name", "mlx5_0"))
    rel = _pci_device(tree, hca.pci(), "0x15b3", hca.get("device_id", "0x101b"), "mlx5_core")
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


def _traffic(doc: _Doc, t: float) -> dict[str, int]:
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


def _sriov(tree: Tree, pf: _Doc, t: float, netlink: dict[str, list[dict[str, Any]]]) -> None:
    vendor = str(pf.get("vendor", "0x8086"))
    rel = _pci_device(
        tree, pf.pci(), vendor, pf.get("device_id", "0x159b"), pf.get("driver", "ice")
    )
    ifname = str(pf.get("pf", "ens1f0"))
    speed = int(pf.number("speed_mbps", 100000))
    _netdev(tree, rel, ifname, arp_type=1, speed=speed, stats=_traffic(pf, t))
    vfs = list(pf.items("vfs", VF_KEYS))
    tree.put(f"{rel}/sriov_totalvfs", max(8, len(vfs)))
    tree.put(f"{rel}/sriov_numvfs", len(vfs))
    recorded = {}
    for index, vf in enumerate(vfs):
        vf_rel = _pci_device(
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


# --- the whole tree, and the node part -------------------------------------------------------


def render(scenario: Scenario, t: float) -> tuple[Tree, dict[str, list[dict[str, Any]]]]:
    """The sysfs tree and the PFs' netlink answers at scenario time `t`."""
    section = _Doc(scenario.name, "sysfs", scenario.sections.get("sysfs") or {}, SECTION_KEYS)
    tree = Tree()
    netlink: dict[str, list[dict[str, Any]]] = {}
    amd = list(section.items("amdgpu", AMD_KEYS))
    intel = list(section.items("intel", INTEL_KEYS))
    cards = [int(g.number("card")) for g in (*amd, *intel)]
    numbers = _Numbers(first_card=max(cards, default=0) + 1)
    kfd: list[dict[str, int]] = []
    for gpu in amd:
        _amdgpu(tree, gpu, numbers, kfd)
    if kfd:
        _kfd(tree, kfd)
    for gpu in intel:
        _intel(tree, gpu, numbers, t)
    for hca in section.items("infiniband", HCA_KEYS):
        _hca(tree, hca, t)
    for pf in section.items("sriov", PF_KEYS):
        _sriov(tree, pf, t, netlink)
    _numa_nodes(tree, section)
    return tree, netlink


def _numa_nodes(tree: Tree, section: _Doc) -> None:
    """`numa_nodes: {0: "0-15", 1: "16-31"}` -> `devices/system/node/node<N>/cpulist` and
    `node/online` (Documentation/ABI/stable/sysfs-devices-node), in the kernel's list
    format, which exporter/numa.py parses."""
    value = section.get("numa_nodes") or {}
    where = f"{section.scenario}: sysfs.numa_nodes"
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: expected a mapping of node -> cpulist")
    for node, cpulist in value.items():
        if isinstance(node, bool) or not isinstance(node, int) or not isinstance(cpulist, str):
            raise ScenarioError(f'{where}: expected `<node number>: "<cpulist>"`, got {node!r}')
        tree.put(f"devices/system/node/node{node}/cpulist", cpulist)
    if value:
        tree.put("devices/system/node/online", ",".join(str(n) for n in sorted(value)))


def write_tree(root: Path, tree: Tree, written: dict[str, str] | None = None) -> None:
    """Make `tree` real under `root`. Files already `written` with the same content are skipped."""
    written = {} if written is None else written
    for rel in sorted(tree.dirs):
        (root / rel).mkdir(parents=True, exist_ok=True)
    for rel, content in tree.files.items():
        if written.get(rel) == content:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(content)
        os.replace(tmp, path)  # a reader sees the old value or the new one, never half
        written[rel] = content
    for rel, target in tree.links.items():
        path = root / rel
        if path.is_symlink():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        (root / target).mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(root / target, path.parent), path)


class SysfsPart:
    """The node part: a sysfs tree under `workdir/sysfs`, moved on with scenario time."""

    def __init__(self, scenario: Scenario, workdir: Path) -> None:
        self.scenario = scenario
        self.root = workdir / "sysfs"
        self.netlink_path = workdir / "netlink-vf-stats.json"
        self.pool_path = workdir / "rdma-shared-dev-plugin.json"
        self._written: dict[str, str] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        section = scenario.sections.get("sysfs") or {}
        self.pools = section.get("rdma_pools") if isinstance(section, Mapping) else None
        if self.pools is not None:
            self.pool_path.write_text(json.dumps(self.pools, indent=2))
        self.advance(0.0)

    def env(self) -> dict[str, str]:
        return {}

    def exporter_args(self) -> list[str]:
        args = ["--path.sysfs", str(self.root)]
        if self.pools is not None:
            args += ["--collector.rdma.pool-config", str(self.pool_path)]
        if self.netlink_path.exists():
            args += ["--collector.netdev.netlink-replay", str(self.netlink_path)]
        return args

    def advance(self, t: float) -> None:
        tree, netlink = render(self.scenario, t)
        write_tree(self.root, tree, self._written)
        if netlink:
            tmp = self.netlink_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(netlink))
            os.replace(tmp, self.netlink_path)

    def close(self) -> None:
        return None


def make_part(scenario: Scenario, workdir: Path) -> SysfsPart:
    return SysfsPart(scenario, workdir)
