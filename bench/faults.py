"""Fault and load runs against a real exporter process (loopback only); prints a markdown table.

    python -m bench.faults            short runs (a minute or so)
    python -m bench.faults --soak     make soak: the long versions (about 12 minutes)

In this order, all exporter processes on 127.0.0.1:
- node faults (bench/node_faults.py): the exporter on a simulated node run here (kubelet,
  NVML, a static sysfs copy, an OTLP receiver), so the script can stop the kubelet, unload
  the driver, write hostile values into sysfs files and stop the collector, and time
  detection and recovery by polling /metrics;
- client faults (bench/client_faults.py): `kde-simulate demo`, attacked with scrapers, idle,
  slowloris and malformed connections, then soaked;
- host reads, the web config and password floods (bench/host_and_web_faults.py), then the
  huge node (bench/bignode.py);
- hostile peers (bench/peer_faults.py: an API server, a kubelet Pods API and PodResources,
  an OTLP/HTTP collector answering what none does) and what keeps /metrics served
  (bench/serving_faults.py: reloads of files replaced by a FIFO or /dev/zero, SIGHUP storms,
  password floods on a first check, clients that never read), issue 41's.
Each row says what was done, what happened and how long the exporter took to be whole again;
docs/reliability.md quotes the output.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
from pathlib import Path

from bench import host_and_web_faults, peer_faults, serving_faults
from bench.client_faults import client_faults
from bench.fault_harness import Row, print_table
from bench.node_faults import node_faults


async def run(long: bool) -> list[Row]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = await node_faults()
    rows += await client_faults(long)
    rows += await host_and_web_faults.run(Path.cwd(), long)  # issue 25
    rows += await peer_faults.run(Path.cwd())  # issue 41
    rows += await serving_faults.run(Path.cwd())
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults")
    parser.add_argument("--soak", action="store_true", help="the long versions")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.soak))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
