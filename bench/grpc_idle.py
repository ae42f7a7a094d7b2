"""What a grpc.aio channel costs between `List` calls: kept open, or closed after each call
and opened again for the next (exporter/podresources/schedule.py decides by this).

Two processes side by side per spacing, each calling `List` on the simulated kubelet every
SPACING seconds: one keeps its channel, one closes it after every call. Each reports its
CPU per call, share of a core and context switches per second (all its threads, from
/proc/self/task, as bench/procs.py counts them for the exporter).

    python -m bench grpc-idle [--spacings 1,2,5,10] [--window S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import NodeProcess, threads_and_switches


def _switches() -> int:
    """This process's context switches so far (a thread that ends meanwhile is skipped)."""
    return threads_and_switches(os.getpid())[1]


async def _calls(socket: str, spacing: float, reopen: bool, window: float) -> dict[str, float]:
    """In the measuring process: List every `spacing` s for `window` s."""
    import grpc.aio  # only the measuring processes load gRPC

    def open_channel() -> tuple[grpc.aio.Channel, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]]:
        channel = grpc.aio.insecure_channel(
            f"unix://{socket}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        rpc = channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=lambda b: b,
            response_deserializer=None,
        )
        return channel, rpc

    channel, rpc = open_channel()
    await rpc(b"", timeout=5)  # warm: the first call loads and connects
    if reopen:
        await channel.close(None)
    await asyncio.sleep(1.0)
    cpu0, sw0, t0 = time.process_time(), _switches(), time.monotonic()
    calls = 0
    while time.monotonic() - t0 < window:
        if reopen:
            channel, rpc = open_channel()
        await rpc(b"", timeout=5)
        calls += 1
        if reopen:
            await channel.close(None)
        await asyncio.sleep(spacing)
    elapsed = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    if not reopen:
        await channel.close(None)
    return {
        "cpu_per_call_s": cpu / calls,
        "core_share": cpu / elapsed,
        "switches_per_s": (_switches() - sw0) / elapsed,
    }


def measure(spacings: tuple[float, ...], window: float) -> list[dict[str, float]]:
    """One row per (spacing, kept or reopened), measured side by side per spacing."""
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="kde-grpc-idle-") as tmp:
        node = NodeProcess.start("dense", Path(tmp))
        socket = node.args[node.args.index("--kubelet-socket") + 1]
        try:
            for spacing in spacings:
                procs = [
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "bench", "grpc-idle", "--one", socket),
                            *(str(spacing), str(int(reopen)), str(window)),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for reopen in (False, True)
                ]
                for reopen, proc in zip((False, True), procs, strict=True):
                    out, _ = proc.communicate(timeout=window + 60)
                    row = json.loads(out.strip().splitlines()[-1])
                    rows.append({"spacing_s": spacing, "reopen": float(reopen), **row})
        finally:
            node.stop()
    return rows


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        socket, spacing, reopen, window = argv[1], float(argv[2]), argv[3] == "1", float(argv[4])
        print(json.dumps(asyncio.run(_calls(socket, spacing, reopen, window))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench grpc-idle")
    parser.add_argument("--spacings", default="1,2,5,10")
    parser.add_argument("--window", type=float, default=40.0)
    args = parser.parse_args(argv)
    spacings = tuple(float(s) for s in args.spacings.split(","))
    print("| List every | channel | CPU per call | share of a core | context switches/s |")
    print("|---|---|---|---|---|")
    for row in measure(spacings, args.window):
        print(
            f"| {row['spacing_s']:g} s | {'closed between' if row['reopen'] else 'kept open'} "
            f"| {row['cpu_per_call_s'] * 1000:.2f} ms | {row['core_share']:.3%} "
            f"| {row['switches_per_s']:.1f} |"
        )
    return 0
