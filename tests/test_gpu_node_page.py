"""docs/gpu-node.md's generator (bench/gpu_node.py) reads what bench/real_gpu.sh wrote: the
XID drain's figures from the probe reach the page as measured, and a driver that refused
the event set is said, not shown as a cost."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu_node import page

XID = {
    "supported_event_types": "0xff9f",
    "xid_supported": True,
    "nvmlEventSetCreate_us": 15.5,
    "nvmlDeviceRegisterEvents_us": 674.7,
    "binding_wait_0ms_us": 4.1,
    "binding_wait_0ms_answer": "NVMLError(10: Timeout)",
    "c_wait_0ms_us": 1.4,
    "c_wait_0ms_returns": {"10": 199, "0": 1},
    "c_wait_100ms": {"return": 10, "ms": 100.2},
}


def _raw(tmp_path: Path, xid: dict[str, object]) -> Path:
    (tmp_path / "probe.json").write_text(json.dumps({"driver": "580.159.04", "xid": xid}))
    (tmp_path / "cpu.txt").write_text("share_of_core=0.267% rss_kib=78904\nsigterm_exit_s 0.022\n")
    return tmp_path


def test_the_xid_drain_figures_reach_the_page(tmp_path: Path) -> None:
    text = page(_raw(tmp_path, XID), "2026-11-28")
    line = next(li for li in text.splitlines() if li.startswith("XID events on GPU 0"))
    assert "supported event types 0xff9f, XID critical errors among them" in line
    assert "costs 1.4 µs as the C function the source calls" in line
    assert "(returns: 10 199 times, 0 1 times;" in line
    assert "4.1 µs through the binding, which raises NVMLError(10: Timeout)" in line
    assert "674.7 µs to register" in line
    assert "a 100 ms wait returned 10 after 100.2 ms" in line
    assert "0.267% of a core, RSS 77 MiB, SIGTERM to exit 0.022 s" in text


def test_a_refused_registration_is_said_not_costed(tmp_path: Path) -> None:
    refused = {
        "supported_event_types": "0x0",
        "xid_supported": False,
        "nvmlEventSetCreate_us": 15.5,
        "nvmlDeviceRegisterEvents_us": 3.0,
        "nvmlDeviceRegisterEvents": "NVMLError(3: Not Supported)",
    }
    text = page(_raw(tmp_path, refused), "2026-11-28")
    line = next(li for li in text.splitlines() if li.startswith("XID events on GPU 0"))
    assert line == (
        "XID events on GPU 0 (supported event types 0x0, XID critical errors not among them): "
        "not measured, NVMLError(3: Not Supported)."
    )


def test_a_probe_without_the_xid_section_leaves_it_out(tmp_path: Path) -> None:
    (tmp_path / "probe.json").write_text(json.dumps({"driver": "580.159.04"}))
    assert "XID events" not in page(tmp_path, "2026-11-28")
