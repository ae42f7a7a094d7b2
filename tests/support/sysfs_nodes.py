"""Sysfs fixtures several test modules read: an AMD GPU and an InfiniBand port as scenario
text (IB's port state is a `{state}` to format), and the dgx node's whole PCI tree."""

from __future__ import annotations

from pathlib import Path

from simulator.scenario import load_scenario
from simulator.sysfs import render
from simulator.sysfstree import write_tree

AMD = """
sysfs:
  amdgpu:
    - pci: "0000:03:00.0"
      card: 1
      busy_percent: 37
      mem_busy_percent: 5
      vram_gib: 64
      vram_used_gib: 1.5
      vis_vram_gib: 0.25
      vis_vram_used_gib: 0.125
      gtt_gib: 16
      gtt_used_gib: 0.5
      power_w: 123.456
      power_cap_w: 300
      temperature_c: {edge: 41.25, junction: 50.5, mem: 38}
      clock_mhz: {sclk: 1700, mclk: 1600}
      pcie_replays: 9
      ras: {umc: {ue: 1, ce: 4}}
"""


AMD_DEV = "devices/pci0000:00/0000:00:03.0/0000:03:00.0"


IB = """
sysfs:
  infiniband:
    - name: mlx5_4
      pci: "0000:c1:00.1"
      netdev: ib4
      ports:
        - port: 1
          state: {state}
          rate: 100 Gb/sec (4X EDR)
          rx_gbps: 8
          tx_gbps: 2
          packet_bytes: 1000
          xmit_wait_per_s: 7
          errors: {{symbol_error: 5, port_xmit_discards: 2}}
          hw_counters: {{out_of_buffer: 3}}
"""


def dgx_sysfs(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    scenario = load_scenario("dgx")
    tree, _ = render(scenario, 0.0)
    write_tree(tmp_path, tree)
    sysfs = scenario.sections["sysfs"]
    gpus = [g["pci_bus_id"] for g in scenario.sections["nvidia"]["gpus"]]
    nics = [h["pci"] for h in sysfs["infiniband"]]
    return tmp_path, gpus, nics
