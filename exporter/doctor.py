"""`kube-device-exporter doctor`: why are my metrics missing?

Run in the exporter's pod (`kubectl exec ... -- kube-device-exporter doctor`), with the
same flags and variables. It asks the kubelet once (List + GetAllocatableResources), runs
each enabled source's collect() once, looks at the host /proc and /sys, and compares what
the node advertises with what the sources see. One line per check; each problem gets its
likely cause and the fix (exporter/checks.py, which the landing page shares). Exit 1 when
something is wrong, above all when the kubelet advertises devices no source can see.
"""

from __future__ import annotations

import asyncio
import threading

from exporter import log as logsetup
from exporter.app import build_sources, exit_now_if_stuck, host_path_problems
from exporter.checks import (
    Finding,
    check_kubelet,
    check_procfs,
    check_source,
    check_sysfs,
    check_unattributed,
    check_unseen,
    failed,
    render,
)
from exporter.config import Config
from exporter.join import ResourceMatcher
from exporter.model import DeviceReading, PodResourcesState, SourceResult
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.sources import Source

# --- the command ------------------------------------------------------------------------------


def run_doctor(config: Config) -> int:
    # Sources log what they cannot read; below warning it would drown the findings.
    logsetup.setup("debug" if config.log_level == "debug" else "warning", config.log_format)
    findings = check_sysfs(host_path_problems(config))
    findings.append(check_procfs(config.procfs))
    state, error = asyncio.run(_ask_kubelet(config))
    findings += check_kubelet(config.kubelet_socket, state, error)
    sources: dict[str, Finding] = {}
    readings: list[DeviceReading] = []
    for name, source in build_sources(config).items():
        result, failure = _collect_once(source, config.collect_timeout)
        try:
            source.close()
        except Exception as exc:  # noqa: BLE001 - a failing close is reported, not fatal
            failure = failure or f"close: {exc}"
        sources[name] = check_source(
            name,
            error=failure,
            absent=result.absent if result else "",
            devices=len(result.readings) if result else 0,
        )
        readings += result.readings if result else ()
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


async def _ask_kubelet(config: Config) -> tuple[PodResourcesState | None, PodResourcesError | None]:
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


def _collect_once(source: Source, timeout: float) -> tuple[SourceResult | None, str]:
    """collect() in a daemon thread: a hung driver call must not hang the doctor."""
    out: list[SourceResult] = []
    errors: list[str] = []

    def work() -> None:
        try:
            out.append(source.collect())
        except Exception as exc:  # noqa: BLE001 - the error is the finding
            errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=work, name="doctor-collect", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return None, f"timed out after {timeout:g}s"
    return (out[0] if out else None), (errors[0] if errors else "")
