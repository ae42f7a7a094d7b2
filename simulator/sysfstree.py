"""A sysfs tree as data, its building blocks, and writing it to disk.

`Tree` holds files, symlinks and empty directories at one moment; the helpers add what every
simulated device has in the kernel's layout (a PCI function under its root port with
`vendor`, `device` and `driver`; DRM card and render nodes; hwmon chips); `write_tree` makes
it real, each file replaced by rename so a reader never sees half of one. `Doc` reads the
scenario's `sysfs:` section, naming the key path in every error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.ids import pci_address
from simulator.scenario import ScenarioError


class Doc:
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

    def items(self, key: str, allowed: set[str]) -> Iterator[Doc]:
        value = self.value.get(key) or []
        if not isinstance(value, list):
            raise ScenarioError(f"{self.scenario}: {self.where}.{key}: expected a list")
        for i, item in enumerate(value):
            yield Doc(self.scenario, f"{self.where}.{key}[{i}]", item, allowed)


@dataclass
class Tree:
    """Files, links and empty directories of a sysfs tree at one moment."""

    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    """link path -> target path, both relative to the root (made relative on disk)."""
    dirs: set[str] = field(default_factory=set)
    pci_paths: dict[str, tuple[str, int]] = field(default_factory=dict)
    """PCI address -> (its directory, NUMA node) where the scenario's `pci_tree` places it
    (sysfspci.py); a device not in it gets `pci_dir` and node 0."""

    def put(self, rel: str, value: object) -> None:
        self.files[rel] = f"{value}\n"

    def link(self, rel: str, target: str) -> None:
        self.links[rel] = target


def pci_dir(address: str) -> str:
    """`devices/pci0000:00/0000:00:<n>.0/<BDF>`: each bus behind a root port of its own."""
    domain, bus = address[:4], int(address[5:7], 16)
    return f"devices/pci{domain}:00/{domain}:00:{bus & 0x1F:02x}.0/{address}"


def pci_device(tree: Tree, address: str, vendor: str, device: str, driver: str) -> str:
    rel, numa_node = tree.pci_paths.get(address, (pci_dir(address), 0))
    tree.put(f"{rel}/vendor", vendor)
    tree.put(f"{rel}/device", device)
    tree.put(f"{rel}/numa_node", numa_node)
    if driver:
        tree.dirs.add(f"bus/pci/drivers/{driver}")
        tree.link(f"{rel}/driver", f"bus/pci/drivers/{driver}")
        tree.link(f"bus/pci/drivers/{driver}/{address}", rel)
    tree.link(f"bus/pci/devices/{address}", rel)
    return rel


class Numbers:
    """Hands out DRM card and render minors and hwmon indices in order, as the kernel does."""

    def __init__(self, first_card: int) -> None:
        self.counters = {"card": first_card, "render": 128, "hwmon": 0}

    def next(self, kind: str) -> int:
        self.counters[kind] += 1
        return self.counters[kind] - 1


def drm_nodes(tree: Tree, parent: str, card: int, render: int) -> None:
    for name in (f"card{card}", f"renderD{render}"):
        tree.put(f"{parent}/drm/{name}/dev", f"226:{card if name.startswith('card') else render}")
        tree.link(f"{parent}/drm/{name}/device", parent)
        tree.link(f"class/drm/{name}", f"{parent}/drm/{name}")


def hwmon_chip(
    tree: Tree, parent: str, index: int, name: str, values: Mapping[str, object]
) -> None:
    rel = f"{parent}/hwmon/hwmon{index}"
    tree.put(f"{rel}/name", name)
    tree.link(f"{rel}/device", parent)
    tree.link(f"class/hwmon/hwmon{index}", rel)
    for key, value in values.items():
        tree.put(f"{rel}/{key}", value)


def labelled(
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
