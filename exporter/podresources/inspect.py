"""`kube-device-exporter podresources`: print what the kubelet reports, to debug attribution.

Missing pod labels are the most common complaint about GPU exporters; this shows the
raw device IDs, resource names and topology the kubelet hands out, as the exporter sees
them, with `Get` for one pod where the kubelet allows it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from exporter.cli.config import DEFAULT_SOCKET
from exporter.podresources.client import PodResourcesClient, PodResourcesError


def run_inspect(argv: Sequence[str]) -> int:
    from exporter.cli.flags import Parser, UsageError, env_name

    # The same socket the exporter uses: its flag, then its variable, then the default.
    variable = env_name("--kubelet-socket")
    parser = Parser(prog="kube-device-exporter podresources", description=__doc__)
    parser.add_argument(
        "--kubelet-socket",
        type=Path,
        metavar="PATH",
        default=Path(os.environ.get(variable) or DEFAULT_SOCKET),
        help=f"PodResources socket (default {DEFAULT_SOCKET}; env {variable})",
    )
    parser.add_argument("--pod", metavar="NS/NAME", help="use Get for this pod only")
    args = parser.parse_args(list(argv))
    if args.pod is not None and args.pod.count("/") != 1:
        raise UsageError(f"--pod: expected NAMESPACE/NAME, got {args.pod!r}")
    try:
        print(json.dumps(asyncio.run(_inspect(args.kubelet_socket, args.pod)), indent=2))
    except PodResourcesError as exc:
        print(f"kube-device-exporter podresources: {exc}")
        return 1
    return 0


async def _inspect(socket: Path, pod: str | None) -> dict[str, Any]:
    client = PodResourcesClient(socket, backoff_initial=0)
    try:
        if pod is not None:
            namespace, name = pod.split("/")
            return {"pod": asdict(await client.get(name, namespace))}
        shown = asdict(await client.poll())
        del shown["resources_listed"]  # the exporter's memory across answers; one answer here
        return shown
    finally:
        await client.close()
