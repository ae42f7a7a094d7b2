"""`python -m bench podresources`: what a List answer costs the client when the kubelet
shuffles it, as the real one does (real kubelet K2), and which change check is cheaper.

A simulated node (`kde-simulate SCENARIO --node-only`, its own process) serves the scenario;
this process fetches `--answers` List answers and times, per answer:
- `bytes equal`: today's check before the fix (equal bytes skip the parse) - under
  shuffling it never hits, so the old client parsed every answer;
- `parse, arrival order`: the parse the old client did on every answer (no sort);
- `parse, canonical`: the parse the client now does (exporter/podresources/parse.py),
  then compared with the last answer's values;
- `wire key`: the alternative, an order-insensitive key of the raw bytes (every repeated
  field's entries sorted, recursively) compared with the last, parsed only on a change;
then the whole `PodResourcesClient.poll()` (process CPU, gRPC threads included) against a
shuffling and a fixed-order kubelet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.procs import NodeProcess
from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter.model import Container, ContainerDevices, Pod
from exporter.podresources.client import PodResourcesClient
from exporter.podresources.parse import LIST_SCHEMA, OrderFreeKey, canonical_bytes, parse_list


def parse_arrival_order(raw: bytes) -> tuple[Pod, ...]:
    """The old client's parse (before canonical order): each entry as it came."""
    response = v1_pb2.ListPodResourcesResponse.FromString(raw)
    return tuple(
        Pod(
            p.name,
            p.namespace,
            tuple(
                Container(
                    c.name,
                    tuple(
                        ContainerDevices(
                            d.resource_name,
                            tuple(d.device_ids),
                            tuple(n.ID for n in d.topology.nodes),
                        )
                        for d in c.devices
                    ),
                    tuple(c.cpu_ids),
                )
                for c in p.containers
            ),
        )
        for p in response.pod_resources
    )


def _per_answer_us(fn: Callable[[bytes], Any], answers: list[bytes]) -> float:
    best = []
    for _ in range(3):
        started = time.perf_counter()
        for raw in answers:
            fn(raw)
        best.append((time.perf_counter() - started) / len(answers))
    return min(best) * 1e6


async def _fetch(socket: str, count: int) -> list[bytes]:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        rpc = channel.unary_unary(
            "/v1.PodResourcesLister/List", request_serializer=None, response_deserializer=None
        )
        answers = []
        for _ in range(count):
            answers.append(await rpc(b""))
            await asyncio.sleep(0.011)  # under the kubelet's 100 calls/s
        return answers


async def _poll_cpu(socket: str, polls: int) -> tuple[float, int]:
    """Process CPU per poll() (the event loop, the parse thread, gRPC's threads), and how
    many answers the client parsed."""
    client = PodResourcesClient(socket, allocatable_interval=3600.0)
    try:
        await client.poll()
        started = time.process_time()
        for _ in range(polls):
            await client.poll()
            await asyncio.sleep(0.011)
        return (time.process_time() - started) / polls, client.parses
    finally:
        await client.close()


def _timings(raw: list[bytes]) -> dict[str, Any]:
    """Per-answer costs of each way to tell a changed answer from a reordered one."""
    response = v1_pb2.ListPodResourcesResponse
    canonical = [parse_list(response, r, []) for r in raw]
    key0 = canonical_bytes(raw[0], LIST_SCHEMA)
    memo_key = OrderFreeKey()
    first = memo_key(raw[0])
    return {
        "answer_bytes": len(raw[0]),
        "pods": len(canonical[0]),
        "distinct_canonical_parses": len(set(canonical)),
        "distinct_wire_keys": len({canonical_bytes(r, LIST_SCHEMA) for r in raw}),
        "distinct_memo_keys": len({memo_key(r) for r in raw}),
        "us_bytes_equal": _per_answer_us(lambda r: r == raw[0], raw),
        "us_parse_arrival_order": _per_answer_us(parse_arrival_order, raw),
        "us_parse_canonical_and_compare": _per_answer_us(
            lambda r: parse_list(response, r, []) == canonical[0], raw
        ),
        "us_wire_key_and_compare": _per_answer_us(
            lambda r: canonical_bytes(r, LIST_SCHEMA) == key0, raw
        ),
        "us_memo_key_and_compare": _per_answer_us(lambda r: memo_key(r) == first, raw),
    }


def _scenario(workdir: Path, name: str, shuffle: bool) -> Path:
    from importlib import resources

    text = (resources.files("simulator") / "scenarios" / f"{name}.yaml").read_text()
    doc = yaml.safe_load(text)
    doc["kubelet"] = {**(doc.get("kubelet") or {}), "shuffle": shuffle}
    path = workdir / f"{name}-{'shuffled' if shuffle else 'fixed'}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def measure(scenario: str, answers: int, polls: int) -> dict[str, Any]:
    out: dict[str, Any] = {"scenario": scenario}
    with tempfile.TemporaryDirectory(prefix="kde-bench-pr-") as tmp:
        for shuffle in (True, False):
            work = Path(tmp) / str(shuffle)
            node = NodeProcess.start(str(_scenario(Path(tmp), scenario, shuffle)), work)
            try:
                socket = node.args[node.args.index("--kubelet-socket") + 1]
                raw = asyncio.run(_fetch(socket, answers))
                cpu, parses = asyncio.run(_poll_cpu(socket, polls))
            finally:
                node.stop()
            kind = "shuffled" if shuffle else "fixed"
            out[f"{kind}_poll_cpu_ms"] = cpu * 1000
            out[f"{kind}_parses"] = f"{parses} of {polls + 1}"
            out[f"{kind}_distinct_answers"] = len(set(raw))
            if shuffle:
                out |= _timings(raw)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench podresources")
    parser.add_argument("--scenario", default="dense")
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--polls", type=int, default=200)
    args = parser.parse_args(argv)
    result = measure(args.scenario, args.answers, args.polls)
    for key, value in result.items():
        print(f"{key:34} {value:.1f}" if isinstance(value, float) else f"{key:34} {value}")
    print(json.dumps(result))
    return 0
