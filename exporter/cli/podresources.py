"""`kube-device-exporter podresources`: print what the kubelet reports, to debug attribution.

Missing pod labels are the most common complaint about GPU exporters; this shows the
raw device IDs, resource names and topology the kubelet hands out, as the exporter sees
them, with `Get` for one pod where the kubelet allows it: a table by default (one row per
container and resource), `-o json` for the whole answer; `--devices-only`, `--resource GLOB`
and `--namespace NS` filter both.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from exporter.cli.podtable import Filter, table
from exporter.model import Pod, PodResourcesState
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.settings.config import DEFAULTS


def run_inspect(argv: Sequence[str]) -> int:
    from exporter.cli.parser import Parser, UsageError, env_name

    # The same socket the exporter uses: its flag, then its variable, then the default.
    variable = env_name("--kubelet-socket")
    parser = Parser(prog="kube-device-exporter podresources", description=__doc__)
    parser.add_argument(
        "--kubelet-socket",
        type=Path,
        metavar="PATH",
        default=Path(os.environ.get(variable) or DEFAULTS.kubelet_socket),
        help=f"PodResources socket (default {DEFAULTS.kubelet_socket}; env {variable})",
    )
    parser.add_argument("--pod", metavar="NS/NAME", help="use Get for this pod only")
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table",
        help="table (default; one row per container and resource) or json (the whole answer)",
    )  # fmt: skip
    parser.add_argument(
        "--devices-only", action="store_true", help="only containers that hold a device"
    )
    parser.add_argument(
        "--resource", action="append", default=[], metavar="GLOB",
        help="only devices of these resources (repeatable; e.g. nvidia.com/*; DRA: DRIVER/POOL)",
    )  # fmt: skip
    parser.add_argument("-n", "--namespace", default="", help="only pods of this namespace")
    args = parser.parse_args(list(argv))
    if args.pod is not None and args.pod.count("/") != 1:
        raise UsageError(f"--pod: expected NAMESPACE/NAME, got {args.pod!r}")
    shown = Filter(args.devices_only, tuple(args.resource), args.namespace)
    try:
        answer = asyncio.run(_inspect(args.kubelet_socket, args.pod))
    except PodResourcesError as exc:
        print(f"kube-device-exporter podresources: {exc}")
        return 1
    print(_json(answer, shown) if args.output == "json" else _table(answer, shown))
    return 0


def _json(answer: Pod | PodResourcesState, shown: Filter) -> str:
    if isinstance(answer, Pod):
        pods = shown.pods([answer])
        return json.dumps({"pod": asdict(pods[0]) if pods else None}, indent=2)
    state = asdict(answer)
    del state["resources_listed"]  # the exporter's memory across answers; one answer here
    state["pods"] = [asdict(p) for p in shown.pods(answer.pods)]
    state["allocatable"] = [asdict(d) for d in shown.allocatable(answer.allocatable)]
    return json.dumps(state, indent=2)


def _table(answer: Pod | PodResourcesState, shown: Filter) -> str:
    if isinstance(answer, Pod):
        return table(shown.pods([answer]), None)
    allocatable = shown.allocatable(answer.allocatable) if answer.allocatable_known else None
    return table(shown.pods(answer.pods), allocatable)


async def _inspect(socket: Path, pod: str | None) -> Pod | PodResourcesState:
    client = PodResourcesClient(socket, backoff_initial=0)
    try:
        if pod is not None:
            namespace, name = pod.split("/")
            return await client.get(name, namespace)
        return await client.poll()
    finally:
        await client.close()
