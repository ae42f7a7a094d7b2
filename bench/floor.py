"""The floor of the exporter's work (issue 27): a process that does only what no exporter
can avoid, so that the exporter's CPU can be given as a multiple of it.

Every INTERVAL seconds it makes one bare grpcio `List` on a channel it keeps (the answer's
bytes, unparsed) and replays the NVML C calls of one `collect()` back to back through
ctypes, with the very arguments (recorded once at start, as `python -m bench nvml-calls`
does: no binding, no Python around them); it serves a fixed /metrics body (gzip, as
scraped) from a bare aiohttp handler. It is scraped as the exporter is. Its CPU is what the
same work costs with nothing of ours in it.

The NVML source reads some values only every `slow-interval` and GPM every `gpm-interval`
(10 s each by default): two cycles are recorded, one with those reads due and one without,
and the floor replays the first whenever the longer of the two intervals has passed since it
last did (every cycle at 30 s, every tenth at 1 s), as the source makes them.

    python -m bench floor INTERVAL SOCKET BODY PORT    (the node's NVML environment set)
    python -m bench floor wake INTERVAL

The second does nothing but wake every INTERVAL seconds (an asyncio sleep): what the
machine charges a process for waking at all. On a VM whose vCPUs halt when idle that is
not small (the 2-CPU VM of docs/performance.md: about 0.3-0.6 % of a core at 1 s), and no
exporter that collects every second can cost less.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import logging
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import nvml_calls

Calls = list[tuple[Any, tuple[Any, ...]]]


@dataclass(frozen=True)
class Recorded:
    due: Calls
    """A collect()'s C calls (function, arguments) with the slow and GPM reads due."""
    plain: Calls
    """A collect()'s C calls without them."""
    every: float
    """The longer of the slow and GPM intervals: how often `due` is replayed."""
    source: Any
    """The NVML source they came from, open: its handles (and its XID event set) are the
    replay's arguments."""


def recorded_nvml_calls() -> Recorded:
    """The C calls of a collect() with the slow and GPM reads due and of one without them,
    from the NVML source itself, on a clock of its own stepped past those intervals."""
    import pynvml

    from exporter.sources import SourceContext
    from exporter.sources.nvml import NvmlSource

    resolve = pynvml._nvmlGetFunctionPointer
    wrapped: dict[str, Any] = {}
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def recording_pointer(name: str) -> Any:
        if name not in wrapped:
            wrapped[name] = nvml_calls._Timed(name, resolve(name), totals)
        return wrapped[name]

    now = [0.0]
    pynvml._nvmlGetFunctionPointer = recording_pointer
    ctx = SourceContext(logger=logging.getLogger("bench.floor"), clock=lambda: now[0])
    source = NvmlSource(ctx)
    every = max(source.slow_interval, source.gpm_interval)
    due: Calls = []
    plain: Calls = []
    try:
        for _ in range(3):  # warm-up: handles, GPM baselines, field ids
            now[0] += every
            source.collect()
        nvml_calls.COUNTING[0] = threading.get_ident()
        for calls, step in ((due, every), (plain, 1.0)):
            now[0] += step
            nvml_calls.RECORDING.append(calls)
            source.collect()
            nvml_calls.RECORDING.clear()
    finally:
        nvml_calls.RECORDING.clear()
        nvml_calls.COUNTING[0] = 0
        pynvml._nvmlGetFunctionPointer = resolve

    def bare(calls: Calls) -> Calls:
        return [(fn._fn if isinstance(fn, nvml_calls._Timed) else fn, a) for fn, a in calls]

    return Recorded(bare(due), bare(plain), every, source)


async def _serve(interval: float, socket: str, body: bytes, port: int) -> None:
    import grpc.aio

    recorded = recorded_nvml_calls()
    due, plain, every = recorded.due, recorded.plain, recorded.every
    channel = grpc.aio.insecure_channel(f"unix://{socket}")
    rpc = channel.unary_unary(
        "/v1.PodResourcesLister/List", request_serializer=lambda b: b, response_deserializer=None
    )
    gzipped = gzip.compress(body, 1)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=gzipped,
            headers={"Content-Encoding": "gzip", "Content-Type": "text/plain; version=0.0.4"},
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    due_at = loop.time()
    while True:
        started = loop.time()
        await rpc(b"", timeout=5)
        nvml = plain
        if started >= due_at:
            nvml, due_at = due, started + every
        for fn, args in nvml:
            fn(*args)
        await asyncio.sleep(max(0.0, interval - (loop.time() - started)))


async def _wake(interval: float) -> None:
    print("ready", flush=True)
    for _ in itertools.count():  # until killed: the waking is the point
        await asyncio.sleep(interval)


def main(argv: list[str]) -> int:
    if argv[:1] == ["wake"]:
        asyncio.run(_wake(float(argv[1])))
        return 0
    interval, socket, body, port = float(argv[0]), argv[1], Path(argv[2]), int(argv[3])
    asyncio.run(_serve(interval, socket, body.read_bytes(), port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
