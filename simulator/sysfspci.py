"""The simulated PCIe hierarchy: host bridges, root ports, switches, and where devices sit.

The `sysfs.pci_tree` section (docs/simulation.md) places devices as the kernel lays them
out: each device directory nested under the bridges above it, under the root bus of its
host bridge, `devices/pci<domain>:<bus>/<root port>/<switch upstream port>/<downstream
port>/<BDF>` (Documentation/filesystems/sysfs.rst: `devices/` "maps directly to the
internal kernel device tree"; Documentation/PCI/sysfs-pci.rst), with
`bus/pci/devices/<BDF>` linking to it for bridges and devices alike and `numa_node` the
host bridge's node (Documentation/ABI/testing/sysfs-bus-pci; the kernel gives a device its
bus's node, `pcibus_to_node`, drivers/pci/probe.c). Bridges have class `0x060400` (PCI
bridge, normal decode: the PCI Code and ID Assignment Specification, class 06 subclass 04).

A port (root port or a switch's downstream port) holds devices directly (`devices`) or a
switch: its upstream port (`switch`) and that switch's downstream ports (`ports`). A device
given as an address is drawn by another part of the section (an `infiniband` HCA), which
puts it here; one given as a mapping (`pci`, `vendor`, `device_id`, `driver`) is drawn here
(an NVIDIA GPU, whose readings come from the simulated NVML, not from sysfs).
"""

from __future__ import annotations

from exporter.ids import pci_address
from simulator.scenario import ScenarioError
from simulator.sysfstree import Doc, Tree, pci_device

HOST_KEYS = {"host_bridge", "numa", "root_ports"}
PORT_KEYS = {"port", "devices", "switch", "ports"}
DEVICE_KEYS = {"pci", "vendor", "device_id", "driver"}
BRIDGE_CLASS = "0x060400"


def render_pci_tree(tree: Tree, section: Doc) -> None:
    """Bridges into `tree`, and every device's place into `tree.pci_paths`; devices given
    with a vendor are drawn too."""
    drawn: list[tuple[str, Doc]] = []
    for host in section.items("pci_tree", HOST_KEYS):
        bus = str(host.get("host_bridge", ""))
        if pci_address(f"{bus}:00.0") is None:
            raise ScenarioError(f"{host.scenario}: {host.where}.host_bridge: expected `dddd:bb`")
        numa = int(host.number("numa", 0))
        for port in host.items("root_ports", PORT_KEYS):
            _port(tree, port, f"devices/pci{bus}", numa, drawn)
    for address, device in drawn:
        pci_device(
            tree,
            address,
            str(device.get("vendor", "0x10de")),
            str(device.get("device_id", "0x2330")),
            str(device.get("driver", "nvidia")),
        )


def _bridge(tree: Tree, parent: str, address: str, numa: int) -> str:
    rel = f"{parent}/{address}"
    tree.put(f"{rel}/class", BRIDGE_CLASS)
    tree.put(f"{rel}/vendor", "0x1000")  # Broadcom/LSI, the PEX switches of DGX systems
    tree.put(f"{rel}/device", "0xc030")
    tree.put(f"{rel}/numa_node", numa)
    tree.link(f"bus/pci/devices/{address}", rel)
    return rel


def _port(tree: Tree, port: Doc, parent: str, numa: int, drawn: list[tuple[str, Doc]]) -> None:
    rel = _bridge(tree, parent, port.pci("port"), numa)
    for i, item in enumerate(port.get("devices") or []):
        where = f"{port.where}.devices[{i}]"
        if isinstance(item, str):
            device = Doc(port.scenario, where, {"pci": item}, DEVICE_KEYS)
        else:
            device = Doc(port.scenario, where, item, DEVICE_KEYS)
            drawn.append((device.pci(), device))
        address = device.pci()
        if address in tree.pci_paths:
            raise ScenarioError(f"{port.scenario}: {where}: {address} placed twice")
        tree.pci_paths[address] = (f"{rel}/{address}", numa)
    if port.get("switch") is not None:
        upstream = _bridge(tree, rel, port.pci("switch"), numa)
        for downstream in port.items("ports", PORT_KEYS):
            _port(tree, downstream, upstream, numa, drawn)
    elif port.get("ports"):
        raise ScenarioError(f"{port.scenario}: {port.where}.ports: only below a `switch`")
