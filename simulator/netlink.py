"""The simulated node's PF netlink: recorded RTM_GETLINK answers in place of the kernel's.

A simulated node has no kernel VFs, so the netdev source's question to a PF (RTM_GETLINK
with IFLA_EXT_MASK=RTEXT_FILTER_VF, `exporter/sources/netdev.py`) has no kernel to answer it.
The sysfs part records the answer each PF would give (`sysfsnet.py` builds it with pyroute2's
own `ifinfmsg`, so it decodes as a live one) to `netlink-vf-stats.json` beside the tree;
`RecordedVfStats` replays it through the source's `vf_reader` seam, which the product leaves
to its callers: no exporter flag knows about it. Only an exporter in the simulator's process
(`kde-simulate SCENARIO`, the tests) gets it; one started from `--node-only`'s line asks the
kernel, as on a node without hostNetwork (docs/simulation.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from exporter.app import build_sources
from exporter.settings.config import Config
from exporter.settings.values import boolean
from exporter.sources import Source
from exporter.sources.netdev import RTEXT_FILTER_VF, NetdevSource, NetStats, parse_vf_stats


class RecordedVfStats:
    """Replays recorded netlink answers: JSON `{PF: [message dict, ...]}` (`record_vf_stats`).

    The file is re-read on every call, as a live answer is asked for every cycle; a PF with
    no recorded answer fails as the kernel fails for an interface it does not have.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def vf_stats(self, pf: str) -> dict[int, NetStats]:
        recorded = json.loads(self.path.read_text())
        if pf not in recorded:
            raise LookupError(f"no recorded answer for {pf}")
        return parse_vf_stats(recorded[pf])


def record_vf_stats(pfs: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """Record the live netlink answers for `pfs` in the form RecordedVfStats replays."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return {
            pf: [m.dump() for m in ipr.link("get", ifname=pf, ext_mask=RTEXT_FILTER_VF)]
            for pf in pfs
        }


def with_recorded_netlink(
    sources: dict[str, Source], recorded: Path, config: Config
) -> dict[str, Source]:
    """`sources` with the netdev source reading `recorded` in place of the kernel, unless the
    flags turned PF netlink off (`--collector.netdev.vf-netlink false`): the simulated node
    stands for a host whose exporter runs with hostNetwork, where `auto` means on."""
    netdev = sources.get("netdev")
    mode = config.source_options.get("netdev", {}).get("vf-netlink", "auto").lower()
    if isinstance(netdev, NetdevSource) and recorded.exists() and (mode == "auto" or boolean(mode)):
        netdev.vf_reader = RecordedVfStats(recorded)
    return sources


def simulated_sources(
    config: Config, recorded: Path | None, *, clock: Callable[[], float] | None = None
) -> dict[str, Source]:
    """Every enabled source, as the exporter builds them, over the simulated node."""
    sources = build_sources(config, clock=clock)
    return sources if recorded is None else with_recorded_netlink(sources, recorded, config)
