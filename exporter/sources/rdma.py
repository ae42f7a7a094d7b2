"""InfiniBand / RDMA ports from `/sys/class/infiniband`: traffic, errors, link, hw_counters.

One device per port (`hw.id` `<ibdev>/<port>`, parent the HCA's PCI address). Ports answer
to their HCA's PCI address, the ID form of the SR-IOV device plugin. The RDMA shared-device
plugin hands out opaque IDs ("0", "1", ...) that name no hardware: which HCAs a pool holds
comes from that plugin's own configuration (`--collector.rdma.pool-config`), and every
port of a matching HCA joins the pool, shared by all its holders.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from exporter.model import Device, DeviceReading, Sample
from exporter.runtime.hostfiles import read_config
from exporter.runtime.log import StateLog
from exporter.sources import SourceContext, SourceOption, add, option_values, register
from exporter.sources.sysfs.reader import Reader
from exporter.sources.sysfs.source import PciIdentity, SysfsSource, alias, device_reading

log = logging.getLogger("exporter.sources.rdma")

BYTES_PER_DATA_WORD = 4
"""`port_{xmit,rcv}_data` count octets divided by 4 (sysfs-class-infiniband ABI)."""

DATA_COUNTERS = {"receive": "port_rcv_data", "transmit": "port_xmit_data"}
PACKET_COUNTERS = {"receive": "port_rcv_packets", "transmit": "port_xmit_packets"}
ERROR_COUNTERS = (
    # (file, error.type, network.io.direction)
    ("port_rcv_errors", "receive", "receive"),
    ("port_rcv_remote_physical_errors", "remote_physical", "receive"),
    ("port_rcv_switch_relay_errors", "switch_relay", "receive"),
    ("port_rcv_contraint_errors", "constraint", "receive"),  # sic: the kernel's spelling
    ("port_xmit_constraint_errors", "constraint", "transmit"),
    ("symbol_error", "symbol", ""),
    ("link_downed", "link_downed", ""),
    ("link_error_recovery", "link_error_recovery", ""),
    ("local_link_integrity_errors", "local_link_integrity", ""),
    ("excessive_buffer_overrun_errors", "excessive_buffer_overrun", "receive"),
    ("VL15_dropped", "vl15_dropped", "receive"),
)
STATE_ACTIVE = 4
"""`ports/<p>/state` reads `4: ACTIVE` when the link is up."""
_RATE = re.compile(r"^\s*(?P<gbps>\d+(?:\.\d+)?)\s*Gb/sec")
DEFAULT_POOL_PREFIX = "rdma"
NET_LINK_TYPES = {1: "ether", 32: "infiniband"}
"""`/sys/class/net/<if>/type` (ARPHRD_*) -> the plugin's `linkTypes` words."""


@dataclass(frozen=True, slots=True)
class PoolSelector:
    """One `configList[]` entry of the k8s-rdma-shared-dev-plugin configuration."""

    resource: str
    vendors: frozenset[str] = frozenset()
    device_ids: frozenset[str] = frozenset()
    drivers: frozenset[str] = frozenset()
    if_names: frozenset[str] = frozenset()
    link_types: frozenset[str] = frozenset()

    def matches(self, pci: PciIdentity, if_names: set[str], link_types: set[str]) -> bool:
        """Every given selector must match (as the plugin filters them one after another)."""
        checks = (
            (self.vendors, {pci.vendor_id.removeprefix("0x")}),
            (self.device_ids, {pci.device_id.removeprefix("0x")}),
            (self.drivers, {pci.driver}),
            (self.if_names, if_names),
            (self.link_types, link_types),
        )
        return all(not wanted or wanted & have for wanted, have in checks)


def parse_pool_config(doc: Any) -> list[PoolSelector]:
    """The plugin's `config.json` (or a ConfigMap holding it as `data."config.json"`)."""
    if isinstance(doc, Mapping) and isinstance(doc.get("data"), Mapping):
        doc = json.loads(str(doc["data"].get("config.json", "{}")))
    if not isinstance(doc, Mapping) or not isinstance(doc.get("configList"), list):
        raise ValueError("no configList (a list of pools) at the top")
    pools = []
    for index, entry in enumerate(doc["configList"]):
        if not isinstance(entry, Mapping):
            raise ValueError(f"configList[{index}]: not a mapping")
        if not entry.get("resourceName"):
            raise ValueError(f"configList[{index}]: no resourceName")
        selectors = entry.get("selectors") or {}
        # `devices` is the deprecated spelling of selectors.ifNames.
        if_names = selectors.get("ifNames") or entry.get("devices") or []
        prefix = entry.get("resourcePrefix") or DEFAULT_POOL_PREFIX
        pools.append(
            PoolSelector(
                resource=f"{prefix}/{entry['resourceName']}",
                vendors=_lower_set(selectors.get("vendors")),
                device_ids=_lower_set(selectors.get("deviceIDs")),
                drivers=frozenset(str(d) for d in selectors.get("drivers") or []),
                if_names=frozenset(str(n) for n in if_names),
                link_types=_lower_set(selectors.get("linkTypes")),
            )
        )
    return pools


def _lower_set(values: Any) -> frozenset[str]:
    return frozenset(str(v).lower().removeprefix("0x") for v in values or [])


def _one_line(exc: Exception) -> str:
    """A YAML error is several lines (the problem, the context, a caret under the text):
    keep the problem and where it is."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1} column {mark.column + 1}: {exc.problem}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split())


def pool_config_file(value: str) -> str:
    """`--collector.rdma.pool-config`: empty, or a pool file that reads and parses now, as
    every file a flag names must at start (README, Flags: a bad one exits 2 naming the
    flag); a later change that breaks it is logged and the last good pools stay."""
    if value:
        try:
            parse_pool_config(yaml.safe_load(Path(value).read_text()))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ValueError(f"{value}: {_one_line(exc)}") from None
    return value


pool_config_file.__name__ = "file_path"  # FILE in --help (values.METAVARS)


class PoolConfig:
    """The pool file, re-read when it changes (a ConfigMap update); bad files are logged.

    Read in the source's own thread, as runtime/hostfiles.py reads a configuration file:
    never blocking (a FIFO or /dev/zero in its place is refused, and so is a file over
    1 MiB), and parsed only when its bytes differ from the last good ones (a ConfigMap's
    atomic swap touches the file without changing it). Whatever replaced it, the file is
    looked at again each cycle: the good one back is used within one."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self.pools: list[PoolSelector] = []
        self._stamp: tuple[int, int, int, int] | None = None
        self._digest = b""
        self._states = StateLog(log)

    def refresh(self) -> bool:
        """Reload if changed; False when the file cannot be used (the last pools stay)."""
        if self.path is None:
            return True
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if stamp == self._stamp:
                return True
            data = read_config(self.path)
            digest = hashlib.sha256(data).digest()
            if digest != self._digest:
                self.pools = parse_pool_config(yaml.safe_load(data.decode()))
                self._digest = digest
            self._stamp = stamp
        except (OSError, ValueError, yaml.YAMLError) as exc:  # UnicodeDecodeError: ValueError
            self._states.failed("pools", f"RDMA pool config {self.path} unusable: {_one_line(exc)}")
            return False
        self._states.ok("pools", f"RDMA pool config {self.path} loaded")
        return True


OPTIONS = (
    SourceOption(
        "pool-config",
        "k8s-rdma-shared-dev-plugin config (its config.json, or the ConfigMap as YAML) "
        "naming which HCAs each rdma/* pool holds; without it pool IDs stay unresolved",
        parse=pool_config_file,
    ),
)
"""`--collector.rdma.*`."""


class RdmaSource(SysfsSource):
    name = "rdma"
    looks_for = "InfiniBand/RDMA devices in class/infiniband"

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.pool_config = PoolConfig(option_values(OPTIONS, ctx.options)["pool-config"])

    def read(self, reader: Reader) -> Iterator[DeviceReading]:
        if not self.pool_config.refresh():
            reader.garbage()
        for ibdev in reader.listdir("class/infiniband"):
            base = f"class/infiniband/{ibdev}"
            pci = self.pci_identity(reader, f"{base}/device")
            if pci is None:
                continue  # a software RDMA device (rxe, siw) has no PCI function to join on
            pools = self._pools(reader, base, pci)
            hca_type = partial(reader.text, f"{base}/hca_type")
            model = self.stable(reader, f"model/{pci.address}", hca_type)
            for port in reader.listdir(f"{base}/ports"):
                yield self._port(
                    reader, ibdev, port, pci=pci, model=model or pci.generic_model, pools=pools
                )

    def _pools(self, reader: Reader, base: str, pci: PciIdentity) -> frozenset[str]:
        if not self.pool_config.pools:
            return frozenset()
        if_names = set(reader.listdir(f"{base}/device/net"))
        link_types = set()
        for name in if_names:
            kind = reader.integer(f"{base}/device/net/{name}/type")
            link_types.add(NET_LINK_TYPES.get(kind if kind is not None else -1, ""))
        for port in reader.listdir(f"{base}/ports"):
            layer = (reader.text(f"{base}/ports/{port}/link_layer") or "").lower()
            link_types.add("ether" if layer == "ethernet" else layer)
        return frozenset(
            p.resource for p in self.pool_config.pools if p.matches(pci, if_names, link_types)
        )

    def _port(
        self,
        reader: Reader,
        ibdev: str,
        port: str,
        *,
        pci: PciIdentity,
        model: str,
        pools: frozenset[str],
    ) -> DeviceReading:
        device = Device(
            id=f"{ibdev}/{port}",
            type="network",
            vendor=pci.vendor,
            model=model,
            source=self.name,
            parent=pci.address,
            attributes=(
                ("hw.pci.bus_id", pci.address),
                ("hw.network.name", ibdev),
                ("hw.network.port", port),
            ),
            aliases=frozenset({alias(pci.address)}),
            pools=pools,
        )
        rel = f"class/infiniband/{ibdev}/ports/{port}"
        counters = f"{rel}/counters"
        samples: list[Sample] = []
        key = device.id

        def counter(metric: str, path: str, *attrs: tuple[str, str], scale: int = 1) -> None:
            raw = reader.integer(path)
            self.counters.add(samples, key, metric, None if raw is None else raw * scale, *attrs)

        for direction, filename in DATA_COUNTERS.items():
            path = f"{counters}/{filename}"
            if not reader.exists(path):
                path = f"{rel}/counters_ext/{filename}_64"  # old kernels: legacy 64-bit files
            io = ("network.io.direction", direction)
            counter("hw.network.io", path, io, scale=BYTES_PER_DATA_WORD)
        for direction, filename in PACKET_COUNTERS.items():
            counter(
                "hw.network.packets", f"{counters}/{filename}", ("network.io.direction", direction)
            )
        transmit = ("network.io.direction", "transmit")
        counter("hw.network.dropped", f"{counters}/port_xmit_discards", transmit)
        for filename, error_type, direction in ERROR_COUNTERS:
            attrs = [("error.type", error_type)]
            if direction:
                attrs.append(("network.io.direction", direction))
            counter("hw.errors", f"{counters}/{filename}", *attrs)
        counter("hw.network.ib.transmit_wait", f"{counters}/port_xmit_wait")
        state = reader.text(f"{rel}/state")
        if state is not None:
            add(samples, "hw.network.up", float(state.split(":")[0].strip() == str(STATE_ACTIVE)))
        add(samples, "hw.network.bandwidth.limit", _rate_bytes(reader, f"{rel}/rate"))
        for name in reader.listdir(f"{rel}/hw_counters"):
            if name == "lifespan":
                continue  # a setting (ms the driver caches counters), not a counter
            hw = ("hw.network.rdma.counter", name)
            counter("hw.network.rdma.statistic", f"{rel}/hw_counters/{name}", hw)
        return device_reading(device, samples)


register(
    "rdma",
    help="InfiniBand/RDMA ports from sysfs (port counters, hw_counters, link), RDMA shared pools",
    options=OPTIONS,
)(RdmaSource)


def _rate_bytes(reader: Reader, rel: str) -> float | None:
    """`100 Gb/sec (4X EDR)` -> bytes per second."""
    text = reader.text(rel)
    if text is None:
        return None
    m = _RATE.match(text)
    if not m:
        reader.garbage()
        return None
    return float(m["gbps"]) * 1e9 / 8
