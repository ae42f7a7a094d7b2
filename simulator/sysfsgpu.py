"""Simulated AMD and Intel GPUs in sysfs: amdgpu (with partitions and the KFD topology),
i915 and xe, in the layout those drivers give their files (docs/simulation.md, `sysfs:`).
"""

from __future__ import annotations

from simulator.scenario import ScenarioError
from simulator.sysfstree import (
    Doc,
    Numbers,
    Tree,
    drm_nodes,
    hwmon_chip,
    labelled,
    pci_device,
)

GIB = 1024**3

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


def render_amdgpu(tree: Tree, gpu: Doc, numbers: Numbers, kfd: list[dict[str, int]]) -> None:
    address = gpu.pci()
    rel = pci_device(tree, address, "0x1002", gpu.get("device_id", "0x74a1"), "amdgpu")
    render = numbers.next("render")
    drm_nodes(tree, rel, int(gpu.number("card")), render)
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
    labelled(
        hwmon, "temp", gpu.table("temperature_c", TEMPERATURE_CHANNELS), TEMPERATURE_CHANNELS, 1000
    )
    labelled(hwmon, "freq", gpu.table("clock_mhz", CLOCK_CHANNELS), CLOCK_CHANNELS, 1e6)
    hwmon_chip(tree, rel, numbers.next("hwmon"), "amdgpu", hwmon)
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
        drm_nodes(tree, f"devices/platform/amdgpu_xcp_{xcp}", numbers.next("card"), minor)
        kfd.append({"render": minor, **memory})


def render_kfd(tree: Tree, nodes: list[dict[str, int]]) -> None:
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


def render_intel(tree: Tree, gpu: Doc, numbers: Numbers, t: float) -> None:
    driver = gpu.get("driver", "i915")
    if driver not in ("i915", "xe"):
        raise ScenarioError(f"{gpu.scenario}: {gpu.where}.driver: i915 or xe, got {driver!r}")
    rel = pci_device(tree, gpu.pci(), "0x8086", gpu.get("device_id", "0x56c0"), driver)
    card = int(gpu.number("card"))
    drm_nodes(tree, rel, card, numbers.next("render"))
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
        labelled(hwmon, "temp", temps, XE_TEMPERATURE_CHANNELS, 1000)
    hwmon_chip(tree, rel, numbers.next("hwmon"), driver, hwmon)


def _xe_gt(tree: Tree, rel: str, kind: str, mhz: int, idle_ms: int) -> None:
    tree.put(f"{rel}/freq0/act_freq", mhz)
    tree.put(f"{rel}/gtidle/idle_residency_ms", idle_ms)
    tree.put(f"{rel}/gtidle/name", f"{rel.rsplit('/', 1)[1]}-{kind}")
