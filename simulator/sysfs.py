"""The simulated sysfs: the scenario's `sysfs:` section as a node part, moved on with time.

Renders the section (docs/simulation.md) into a tree with the kernel's real layout, symlinks
included: `class/drm/cardN -> ../../devices/pci.../drm/cardN`, `bus/pci/devices/<BDF>`,
`driver` links, hwmon chips, the KFD topology, IB ports, netdevs, `virtfnN`/`physfn`
(`sysfsgpu.py` and `sysfsnet.py` render the devices, `sysfstree.py` the files). Counters grow
with scenario time (`advance(t)`), written by rename so a reader never sees half a file. The
tests build their fixture trees with this same renderer, so fixtures and simulator cannot
drift apart. A PF's netlink VF-stats answer is recorded to a JSON file beside the tree,
which netlink.py replays to an exporter in the simulator's process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simulator.scenario import Scenario, ScenarioError
from simulator.sysfsgpu import AMD_KEYS, INTEL_KEYS, render_amdgpu, render_intel, render_kfd
from simulator.sysfsnet import HCA_KEYS, PF_KEYS, render_hca, render_sriov
from simulator.sysfspci import render_pci_tree
from simulator.sysfstree import Doc, Numbers, Tree, write_tree

SECTION_KEYS = {"amdgpu", "intel", "infiniband", "rdma_pools", "sriov", "numa_nodes", "pci_tree"}


def render(scenario: Scenario, t: float) -> tuple[Tree, dict[str, list[dict[str, Any]]]]:
    """The sysfs tree and the PFs' netlink answers at scenario time `t`."""
    section = Doc(scenario.name, "sysfs", scenario.sections.get("sysfs") or {}, SECTION_KEYS)
    tree = Tree()
    render_pci_tree(tree, section)  # first: it places the devices the others render
    netlink: dict[str, list[dict[str, Any]]] = {}
    amd = list(section.items("amdgpu", AMD_KEYS))
    intel = list(section.items("intel", INTEL_KEYS))
    cards = [int(g.number("card")) for g in (*amd, *intel)]
    numbers = Numbers(first_card=max(cards, default=0) + 1)
    kfd: list[dict[str, int]] = []
    for gpu in amd:
        render_amdgpu(tree, gpu, numbers, kfd)
    if kfd:
        render_kfd(tree, kfd)
    for gpu in intel:
        render_intel(tree, gpu, numbers, t)
    for hca in section.items("infiniband", HCA_KEYS):
        render_hca(tree, hca, t)
    for pf in section.items("sriov", PF_KEYS):
        render_sriov(tree, pf, t, netlink)
    _numa_nodes(tree, section)
    return tree, netlink


def _numa_nodes(tree: Tree, section: Doc) -> None:
    """`numa_nodes: {0: "0-15", 1: "16-31"}` -> `devices/system/node/node<N>/cpulist` and
    `node/online` (Documentation/ABI/stable/sysfs-devices-node), in the kernel's list
    format, which exporter/derive/numa.py parses."""
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
