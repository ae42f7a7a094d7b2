"""`kube-device-exporter doctor`: why are my metrics missing?

Run in the exporter's pod (`kubectl exec ... -- kube-device-exporter doctor`), with the
same flags and variables. It asks the kubelet once (List + GetAllocatableResources) while
one cycle of the exporter's poller runs each enabled source's collect(), looks at the host
/proc and /sys, and compares what the node advertises with what the sources see. One line
per check; each problem gets its likely cause and the fix (exporter/checks.py, which the
landing page shares). Exit 1 when something is wrong, above all when the kubelet
advertises devices no source can see.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from exporter.app import build_sources
from exporter.checks import (
    PROBLEM,
    Finding,
    check_kubelet,
    check_procfs,
    check_sysfs,
    check_unattributed,
    check_unseen,
    failed,
    host_path_problems,
    render,
    source_findings,
)
from exporter.cycle.collect import Collect
from exporter.cycle.pipeline import Cycle
from exporter.ids import ResourceMatcher
from exporter.model import DeviceReading, PodResourcesState, SourceHealth
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.runtime import log as logsetup
from exporter.runtime.process import exit_now_if_stuck
from exporter.settings.config import Config

# --- the command ------------------------------------------------------------------------------


def run_doctor(config: Config) -> int:
    # Sources log what they cannot read; below warning it would drown the findings.
    logsetup.setup("debug" if config.log_level == "debug" else "warning", config.log_format)
    if config.log_level != "debug":
        # The cycle's own warnings say what the findings below say, better.
        logging.getLogger("exporter.poller").setLevel(logging.CRITICAL)
    findings = [Finding(PROBLEM, "environment", notice) for notice in config.notices]
    findings += check_sysfs(host_path_problems(config))
    findings.append(check_procfs(config.procfs))
    (state, error), (healths, readings) = asyncio.run(_ask(config))
    findings += check_kubelet(config.kubelet_socket, state, error)
    sources = source_findings(healths, readings)
    findings += sources.values()
    if state is not None:
        matcher = ResourceMatcher(config.resource_patterns)
        findings += check_unseen(state.allocatable, readings, matcher, sources)
        findings += check_unattributed(state.allocatable, matcher)
    print(render(findings))
    bad = failed(findings)
    print(
        "\nproblems found: see the lines marked PROBLEM"
        if bad
        else "\nno problems: every device the node advertises is seen"
    )
    # A driver call still hung in a library's own (non-daemon) thread must not keep us here.
    return exit_now_if_stuck(1 if bad else 0)


async def _ask(
    config: Config,
) -> tuple[
    tuple[PodResourcesState | None, PodResourcesError | None],
    tuple[list[SourceHealth], list[DeviceReading]],
]:
    """The kubelet and every source, at the same time."""
    return await asyncio.gather(_ask_kubelet(config), _collect_once(config))


async def _ask_kubelet(config: Config) -> tuple[PodResourcesState | None, PodResourcesError | None]:
    """The kubelet on its own, not in the cycle: its error's code picks the likely cause."""
    client = PodResourcesClient(
        config.kubelet_socket,
        timeout=config.podresources_timeout,
        max_message_bytes=config.podresources_max_message_bytes,
        backoff_initial=0,
    )
    try:
        return await client.poll(), None
    except PodResourcesError as exc:
        return None, exc
    finally:
        await client.close()


async def _collect_once(config: Config) -> tuple[list[SourceHealth], list[DeviceReading]]:
    """The exporter's own collect step over every enabled source (in daemon threads,
    `--collect-timeout` each, all at once), then each source closed; a source that fails
    to close is failed."""
    collect = Collect(build_sources(config), None, source_timeout=config.collect_timeout)
    cycle = Cycle(number=1, started=time.monotonic())
    try:
        await collect.run(cycle)
    finally:
        unclosed = await collect.close(config.collect_timeout)
    healths = [
        replace(h, success=False, error=h.error or f"close: {unclosed[h.name]}")
        if h.name in unclosed
        else h
        for h in cycle.healths
    ]
    return healths, [reading for result in cycle.collected for reading in result.readings]
