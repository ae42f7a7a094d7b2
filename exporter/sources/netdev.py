"""SR-IOV NICs: every virtual function by PCI address (the SR-IOV device plugin's IDs).

A VF whose netdev is in the host's network namespace is read from its sysfs statistics
(`hw.network.stats_source="host_sysfs"`). Once the CNI moves it into a pod's namespace it
vanishes from the host's `/sys/class/net`; its counters then come from the PF's side of
the switch over netlink: RTM_GETLINK on the PF with IFLA_EXT_MASK=RTEXT_FILTER_VF returns
IFLA_VF_STATS per VF (`pf_netlink`), through pyroute2. That needs the exporter in the
host network namespace (hostNetwork) and a PF driver that reports VF stats (mlx5, ice,
i40e... do). The alternative, reading `/proc/<pid>/net/dev` inside a pod's namespace
(`pod_netns`), needs hostPID and a pod process to enter, and is not implemented.

PFs with VFs are reported too (they are the VFs' `hw.parent`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from exporter.ids import interface_key
from exporter.model import Device, DeviceReading, Sample
from exporter.runtime import hostfiles
from exporter.runtime.log import StateLog
from exporter.settings.values import auto_boolean, boolean
from exporter.sources import SourceContext, SourceOption, add, option_values, register
from exporter.sources.sysfs.reader import Reader, numbered
from exporter.sources.sysfs.source import PciIdentity, SysfsSource, alias, device_reading

log = logging.getLogger("exporter.sources.netdev")

RTEXT_FILTER_VF = 1
"""IFLA_EXT_MASK bit that makes RTM_GETLINK include the VF list with stats."""


@dataclass(frozen=True, slots=True)
class NetStats:
    """Cumulative interface counters (bytes, packets); None where the driver has none."""

    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rx_packets: int | None = None
    tx_packets: int | None = None
    rx_dropped: int | None = None
    tx_dropped: int | None = None
    rx_errors: int | None = None
    tx_errors: int | None = None


SAMPLES = (
    # (NetStats field, metric, extra attribute)
    ("rx_bytes", "hw.network.io", None),
    ("tx_bytes", "hw.network.io", None),
    ("rx_packets", "hw.network.packets", None),
    ("tx_packets", "hw.network.packets", None),
    ("rx_dropped", "hw.network.dropped", None),
    ("tx_dropped", "hw.network.dropped", None),
    ("rx_errors", "hw.errors", ("error.type", "receive")),
    ("tx_errors", "hw.errors", ("error.type", "transmit")),
)

_VF_STATS_FIELDS = {
    "IFLA_VF_STATS_RX_BYTES": "rx_bytes",
    "IFLA_VF_STATS_TX_BYTES": "tx_bytes",
    "IFLA_VF_STATS_RX_PACKETS": "rx_packets",
    "IFLA_VF_STATS_TX_PACKETS": "tx_packets",
    "IFLA_VF_STATS_RX_DROPPED": "rx_dropped",
    "IFLA_VF_STATS_TX_DROPPED": "tx_dropped",
}


# --- PF-side VF statistics over netlink ------------------------------------------------------


def _attrs(nla: Any) -> list[tuple[str, Any]]:
    """(name, value) pairs of a netlink attribute in pyroute2's dict shape."""
    return [(str(a[0]), a[1]) for a in (nla or {}).get("attrs", [])]


def parse_vf_stats(messages: Iterable[Any]) -> dict[int, NetStats]:
    """VF index -> stats from RTM_NEWLINK answers: pyroute2 messages or their `.dump()` dicts."""
    stats: dict[int, NetStats] = {}
    for msg in messages:
        doc = msg.dump() if hasattr(msg, "dump") else msg
        for name, vflist in _attrs(doc):
            if name != "IFLA_VFINFO_LIST":
                continue
            for info_name, info in _attrs(vflist):
                if info_name != "IFLA_VF_INFO":
                    continue
                parts = dict(_attrs(info))
                vf = (parts.get("IFLA_VF_MAC") or {}).get("vf")
                counters = dict(_attrs(parts.get("IFLA_VF_STATS")))
                if vf is None or not counters:
                    continue
                values = {f: counters.get(n) for n, f in _VF_STATS_FIELDS.items()}
                stats[int(vf)] = NetStats(
                    **{k: None if v is None else int(v) for k, v in values.items()}
                )
    return stats


class VfStatsReader(Protocol):
    def vf_stats(self, pf: str) -> dict[int, NetStats]:
        """VF index -> stats as the PF `pf` (an interface name) reports them. Raises on failure."""
        ...


class NetlinkVfStats:
    """Asks the kernel, one RTM_GETLINK per PF (about a millisecond each)."""

    def vf_stats(self, pf: str) -> dict[int, NetStats]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            return parse_vf_stats(ipr.link("get", ifname=pf, ext_mask=RTEXT_FILTER_VF))


# --- the source ------------------------------------------------------------------------------


OPTIONS = (
    SourceOption(
        "vf-netlink",
        "read statistics of VFs moved into pod namespaces from their PF over netlink: "
        "auto (on only in the host network namespace, i.e. with hostNetwork), true, false",
        "auto",
        auto_boolean,
    ),
)
"""`--collector.netdev.*`."""


class NetdevSource(SysfsSource):
    name = "netdev"
    looks_for = "SR-IOV physical functions in class/net"

    def __init__(self, ctx: SourceContext, vf_reader: VfStatsReader | None = None) -> None:
        super().__init__(ctx)
        # `vf_reader` answers in place of the kernel for a caller that has none to ask (a
        # simulated node's recorded answers, a test's failing PF); no flag reaches it.
        self.vf_reader: VfStatsReader | None = vf_reader or NetlinkVfStats()
        mode = option_values(OPTIONS, ctx.options)["vf-netlink"].lower()
        if mode == "auto":
            # The PF's netlink answers only in the host's network namespace; the DaemonSet
            # has its own unless hostNetwork is set.
            host = in_host_netns(ctx.sysfs)
            log.info(
                "VF statistics over PF netlink: %s (%s the host network namespace)",
                "on" if host else "off",
                "in" if host else "not in",
            )
            if not host and vf_reader is None:
                self.vf_reader = None
        elif not boolean(mode):
            self.vf_reader = None
        self._states = StateLog(log)

    def read(self, reader: Reader) -> Iterator[DeviceReading]:
        for ifname in reader.listdir("class/net"):
            dev = f"class/net/{ifname}/device"
            virtfns = [e for e in reader.listdir(dev) if numbered(e, "virtfn") is not None]
            if not virtfns:
                continue  # not an SR-IOV PF
            pf = self.pci_identity(reader, dev)
            if pf is None:
                continue
            yield self._interface(reader, pf, f"class/net/{ifname}", ifname, parent="")
            from_pf: dict[int, NetStats] | None = None
            for virtfn in sorted(virtfns, key=lambda e: int(e[6:])):
                vf = self.pci_identity(reader, f"{dev}/{virtfn}")
                if vf is None:
                    continue
                names = reader.listdir(f"{dev}/{virtfn}/net")
                if names:
                    net = f"{dev}/{virtfn}/net/{names[0]}"
                    yield self._interface(reader, vf, net, names[0], parent=pf.address)
                    continue
                if from_pf is None:
                    from_pf = self._from_pf(reader, ifname)
                # Missing stats (a failed answer) repeat the last values; the label stays put.
                stats = from_pf.get(int(virtfn[6:]))
                source = "pf_netlink" if self.vf_reader is not None else ""
                yield self._reading(
                    vf, parent=pf.address, ifname="", stats_source=source, stats=stats, samples=[]
                )

    def _from_pf(self, reader: Reader, pf: str) -> dict[int, NetStats]:
        if self.vf_reader is None:
            return {}
        try:
            stats = self.vf_reader.vf_stats(pf)
        except Exception as exc:  # noqa: BLE001 - netlink, file and decoding errors alike
            reader.garbage()
            self._states.failed(f"pf/{pf}", f"VF statistics of {pf} over netlink failed: {exc}")
            return {}
        self._states.ok(f"pf/{pf}", f"VF statistics of {pf} over netlink answering again")
        return stats

    def _interface(
        self, reader: Reader, pci: PciIdentity, net: str, ifname: str, parent: str
    ) -> DeviceReading:
        stats = NetStats(
            **{f.name: reader.integer(f"{net}/statistics/{f.name}") for f in fields(NetStats)}
        )
        samples: list[Sample] = []
        operstate = reader.text(f"{net}/operstate")
        if operstate is not None:
            add(samples, "hw.network.up", float(operstate == "up"))
        speed = reader.integer(f"{net}/speed", (-1, 2**32)) if operstate == "up" else None
        # speed is Mb/s, and reads -1 (or fails with EINVAL) while the link is down.
        add(samples, "hw.network.bandwidth.limit", speed * 1e6 / 8 if speed and speed > 0 else None)
        return self._reading(
            pci,
            parent=parent,
            ifname=ifname,
            stats_source="host_sysfs",
            stats=stats,
            samples=samples,
        )

    def _reading(
        self,
        pci: PciIdentity,
        *,
        parent: str,
        ifname: str,
        stats_source: str,
        stats: NetStats | None,
        samples: list[Sample],
    ) -> DeviceReading:
        device = Device(
            id=pci.address,
            type="network",
            vendor=pci.vendor,
            model=pci.generic_model,
            source=self.name,
            parent=parent,
            attributes=(
                ("hw.pci.bus_id", pci.address),
                ("hw.network.name", ifname),
                ("hw.network.stats_source", stats_source),
            ),
            # The host-side interface name names it too (DRANET's `dra.net/ifName`).
            aliases=frozenset({alias(pci.address), *([interface_key(ifname)] if ifname else [])}),
        )
        values = stats or NetStats()
        for field_name, metric, extra in SAMPLES:
            direction = "receive" if field_name.startswith("rx") else "transmit"
            attrs = [a for a in (extra, ("network.io.direction", direction)) if a]
            self.counters.add(samples, device.id, metric, getattr(values, field_name), *attrs)
        return device_reading(device, samples)


register(
    "netdev",
    help="SR-IOV NIC PFs and VFs by PCI address (sysfs; PF-side netlink for VFs in pods)",
    options=OPTIONS,
)(NetdevSource)


def in_host_netns(sysfs: Path) -> bool:
    """Whether this process shares the host's network namespace: the host's sysfs (the
    mounted `--path.sysfs`) lists the interfaces of the host's namespace; ours are what
    the kernel gives this process. Same names with the same ifindex: the same namespace."""
    try:
        ours = {(name, index) for index, name in socket.if_nameindex()}
    except OSError:
        return False
    host: set[tuple[str, int]] = set()
    net = sysfs / "class" / "net"
    try:
        for entry in net.iterdir():
            text = hostfiles.read_text(entry / "ifindex", 64, nofollow=True)
            if text is not None and text.strip().isascii() and text.strip().isdigit():
                host.add((entry.name, int(text)))
    except OSError:
        return False
    return bool(host) and host == ours
