"""The landing page, rendered on the server from the cycle's summary: the first view is
complete without JavaScript (curl, a screenshot taken at load); the page's script only
fetches the page again and swaps the live part in."""

from __future__ import annotations

import time
from html import escape
from importlib import resources
from typing import Any

_TEMPLATE = (resources.files("exporter.web") / "static" / "index.html").read_text()

VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel", "mellanox": "Mellanox"}


def render_page(summary: dict[str, Any] | None) -> bytes:
    if summary is None:
        live = '<p class="meta" id="meta">waiting for the first collection cycle…</p>'
    else:
        live = "\n".join(
            [
                f'<p class="meta" id="meta">{escape(_meta(summary))}</p>',
                _table(summary["devices"]),
                _unresolved(summary["unresolved"]),
                _checks(summary["checks"]),
            ]
        )
    return _TEMPLATE.replace("<!--LIVE-->", live).encode()


def _meta(summary: dict[str, Any]) -> str:
    kubelet = summary["kubelet"]
    parts = [
        f"node {summary['node']}",
        f"{len(summary['devices'])} devices",
        f"kubelet {kubelet['api_version']}" if kubelet["connected"] else "kubelet unreachable",
    ]
    failing = [s["name"] for s in summary["sources"] if not s["success"]]
    if failing:
        parts.append(f"failing: {', '.join(failing)}")
    updated = time.strftime("%H:%M:%S UTC", time.gmtime(summary["timestamp"]))
    return " · ".join([*parts, f"updated {updated}", f"v{summary['version']}"])


def _table(devices: list[dict[str, Any]]) -> str:
    rows = "\n".join(_row(d) for d in devices)
    return (
        '<table id="devices">\n<thead><tr><th>Device</th><th>Model</th><th>Held by</th>'
        "<th>Load</th><th>Memory / traffic</th><th>Power</th></tr></thead>\n"
        f"<tbody>\n{rows}\n</tbody>\n</table>\n"
        '<p class="legend"><span class="free">free</span>: a device plugin offers it to pods '
        'and none holds it. <span class="unrequested"><b>used without request</b></span>: a '
        "pod's processes use it though the pod requested no such device (its share of the "
        "load and memory). <i>partitioned</i>: a GPU split into MIG slices or partitions; "
        "who holds them is on their rows. <span>—</span> in <i>Held by</i>: not offered to "
        "pods as a whole (its VFs are, or no resource pattern matches it); elsewhere: the "
        "device does not report that value.</p>"
    )


def _row(d: dict[str, Any]) -> str:
    cls = ' class="child"' if d["depth"] else ""
    indent = f' style="padding-left:{0.6 + 1.4 * d["depth"]:.1f}rem"' if d["depth"] else ""
    state = " failed" if d.get("state") == 2 else ""
    cells = [
        f'<td class="device{state}"{indent}>{_device_name(d)}</td>',
        f"<td>{escape(_model(d))}</td>",
        f"<td>{_holders(d)}</td>",
        f"<td>{_load(d)}</td>",
        f"<td>{escape(_memory(d))}</td>",
        f"<td>{escape(_power(d))}</td>",
    ]
    return f'<tr{cls} data-id="{escape(d["id"])}" data-depth="{d["depth"]}">{"".join(cells)}</tr>'


def _device_name(d: dict[str, Any]) -> str:
    profile = d["attributes"].get("hw.gpu.mig.profile")
    index = str(d.get("index", ""))
    if profile:
        label = f"MIG {profile}"
    elif index.isdigit():
        label = f"GPU {index}"
    elif index:
        label = index
    elif d["type"] == "network":
        label = d["attributes"].get("hw.network.name", "") or ("VF" if d["parent"] else "NIC")
        port = d["attributes"].get("hw.network.port")
        label += f" port {port}" if port else ""
    else:
        label = d["type"].upper() if d["type"] == "gpu" else d["type"]
    badge = ""
    if d.get("not_allocatable"):
        why = (
            f"the kubelet no longer lists it as {d.get('resource', '')}: "
            "its device plugin reports it unhealthy"
        )
        badge = f' <span class="badge" title="{escape(why)}">not allocatable</span>'
    return f"<b>{escape(label)}</b> <code>{escape(d['id'])}</code>{badge}"


def _model(d: dict[str, Any]) -> str:
    vendor = VENDOR_NAMES.get(d["vendor"], d["vendor"])
    model = d["model"]
    return model if vendor.lower() in model.lower() or not vendor else f"{vendor} {model}"


def _holders(d: dict[str, Any]) -> str:
    return _held(d) + "".join(_unrequested(u) for u in d.get("unrequested", []))


def _unrequested(use: dict[str, Any]) -> str:
    """A pod whose processes use the device although it did not request it (an image with
    NVIDIA_VISIBLE_DEVICES=all): the case this page exists for, never shown as `free`."""
    owner = f"{use['namespace']}/{use['pod']}/{use['container']}"
    shares = [f"{round(use['utilization'] * 100)}%"] if use["utilization"] is not None else []
    shares += [_gib(use["memory"])] if use["memory"] is not None else []
    what = (
        "its processes use this device, but it requested none (hw_allocation_requested="
        '"false"; the KubeDeviceUsedWithoutRequest alert)'
    )
    text = f"{owner}: {', '.join(shares)}" if shares else owner
    return (
        f'<div class="unrequested" title="{escape(what)}"><b>used without request</b> '
        f"{escape(text)}</div>"
    )


def _held(d: dict[str, Any]) -> str:
    if not d["holders"] and d.get("partitions"):
        parts, held = d["partitions"], d["partitions_held"]
        what = f"split into {parts} part{'s' if parts != 1 else ''} (rows below), {held} held"
        return (
            f'<span class="none" title="{escape(what)}">partitioned: {held} of {parts} held</span>'
        )
    if not d["holders"]:
        if d.get("unrequested"):
            return ""  # held by none, used by a pod that did not ask: not free
        if d["allocatable"]:
            return '<span class="free" title="offered to pods, held by none">free</span>'
        return '<span class="none" title="not offered to pods as a whole">—</span>'
    lines = []
    for h in d["holders"]:
        text = f"{h['namespace']}/{h['pod']}/{h['container']}"
        if h["shared"]:
            text += f" (shared, replica {h['replica']})" if h["replica"] else " (shared)"
        lines.append(f'<div title="{escape(h["resource"])}: {escape(h["device_id"])}">')
        lines[-1] += f"{escape(text)}</div>"
    return "".join(lines)


def _load(d: dict[str, Any]) -> str:
    if "utilization" in d:
        pct = round(d["utilization"] * 100)
        return f'<span class="bar"><span style="width:{pct}%"></span></span> {pct}%'
    if "link_up" in d:
        text = "link up" if d["link_up"] else "link down"
        if d.get("link_speed"):
            text += f" · {d['link_speed'] * 8 / 1e9:g} Gb/s"
        return escape(text)
    return "—"


def _memory(d: dict[str, Any]) -> str:
    if "usage" in d and d.get("limit"):
        return f"{_gib(d['usage'])} / {_gib(d['limit'])}"
    if "receive_bytes" in d or "transmit_bytes" in d:
        return f"rx {_gib(d.get('receive_bytes', 0))} · tx {_gib(d.get('transmit_bytes', 0))}"
    return "—"


def _power(d: dict[str, Any]) -> str:
    return f"{d['power']:.0f} W" if "power" in d else "—"


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def _unresolved(holders: list[dict[str, str]]) -> str:
    if not holders:
        return ""
    text = "; ".join(
        f"{h['namespace']}/{h['pod']} {h['resource']}={h['device_id']}" for h in holders
    )
    return f'<p id="unresolved">Allocations naming no known device: {escape(text)}</p>'


def _checks(checks: list[dict[str, str]]) -> str:
    items = []
    for c in checks:
        detail = "".join(
            f'<div class="hint">{label}: {escape(c[key])}</div>'
            for key, label in (("cause", "likely cause"), ("fix", "fix"))
            if c[key]
        )
        items.append(
            f'<li class="{escape(c["status"])}"><b>{escape(c["status"])}</b> '
            f"{escape(c['subject'])}: {escape(c['found'])}{detail}</li>"
        )
    return (
        '<h2>Checks</h2>\n<p class="meta">What <code>kube-device-exporter doctor</code> '
        "reports, from the last cycle (run it in this pod for the kubelet's and each "
        f'source\'s details).</p>\n<ul id="checks">{"".join(items)}</ul>'
    )
