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
from pathlib import Path

from exporter.app import build_sources
from exporter.checks import (
    ABSENT,
    OK,
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
    (state, error), (healths, readings), kubernetes = asyncio.run(_ask(config))
    findings += check_kubelet(config.kubelet_socket, state, error)
    findings += kubernetes
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
    list[Finding],
]:
    """The kubelet, every source and (with --kubernetes.api) the pod feeds, at the same time."""
    return await asyncio.gather(
        _ask_kubelet(config), _collect_once(config), _ask_kubernetes(config)
    )


async def _ask_kubernetes(config: Config) -> list[Finding]:
    """With --kubernetes.api: does the API server answer this pod's list of its node's pods
    (what the watch and the owner reads need), and does the kubelet's Pods API answer where
    its socket is (the exporter then reads pods from it, not from an API server watch)?"""
    if not config.kubernetes_api:
        return []
    from exporter.kubeapi import REQUEST_TIMEOUT_SECONDS
    from exporter.kubeapi.client import ApiError, KubeApi, NotConfigured, describe, http_client
    from exporter.kubeapi.client import load_config as load_kubeconfig

    subject = "Kubernetes API"
    api: KubeApi | None = None
    try:
        settings = load_kubeconfig(config.kubeconfig)
        api = KubeApi(http_client(settings, REQUEST_TIMEOUT_SECONDS))
        pods, _ = await api.list_pods(config.node_name)
        server = str(getattr(settings.cluster, "server", "") or "")
        found = [Finding(OK, subject, f"{server}: {len(pods)} pods on node {config.node_name}")]
    except NotConfigured as exc:
        found = [Finding(PROBLEM, subject, str(exc),
                         "no kubeconfig, and no ServiceAccount token in this pod",
                         "deploy with components/kubernetes-api (chart: kubernetesApi.enabled), "
                         "which mounts the token and grants the RBAC it needs")]  # fmt: skip
    except ApiError as exc:
        denied = exc.code in (401, 403)
        found = [Finding(PROBLEM, subject, f"listing this node's pods: {exc}",
                         "the ServiceAccount may not list pods" if denied else "",
                         "apply components/kubernetes-api's ClusterRole and binding (chart: "
                         "kubernetesApi.enabled)" if denied else "")]  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - unreachable, TLS, a bad answer: said, not raised
        found = [Finding(PROBLEM, subject, describe(exc),
                         "the API server is not reachable from this pod",
                         "check KUBERNETES_SERVICE_HOST/PORT (or the kubeconfig's server) and "
                         "network policies between the node and the API server")]  # fmt: skip
    finally:
        if api is not None:
            await api.close()
    return [*found, await _ask_pods_api(config)]


async def _ask_pods_api(config: Config) -> Finding:
    """The kubelet's Pods API socket, as the exporter picks its pod feed at start."""
    subject = "kubelet Pods API"
    socket = Path(config.pods_api_socket) if config.pods_api_socket else None
    if config.kubernetes_dra:
        return Finding(OK, subject, "not used with --kubernetes.dra: pods from the API server")
    if socket is None or not socket.exists():
        return Finding(
            ABSENT, subject,
            f"no socket at {socket or '(none: --kubernetes.pods-api-socket is empty)'}: pods "
            "from the API server's watch",
            "the kubelet's PodsAPI gate is off (alpha in 1.36), or components/pods-api "
            "(chart: kubernetesApi.podsApi) does not mount its folder",
        )  # fmt: skip
    import grpc.aio

    from exporter._proto.podsapi.v1alpha1 import api_pb2 as pb
    from exporter._proto.podsapi.v1alpha1 import api_pb2_grpc as pb_grpc

    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = pb_grpc.PodsStub(channel)
            listed = await stub.ListPods(pb.ListPodsRequest(), timeout=config.podresources_timeout)
    except grpc.aio.AioRpcError as exc:
        why = "the socket is there but the kubelet does not answer on it; the exporter reads "
        why += "pods from it and retries with back-off meanwhile"
        return Finding(PROBLEM, subject, f"{socket}: {exc.code().name}: {exc.details()}", why)
    return Finding(OK, subject, f"{socket}: {len(listed.pods)} pods; pods are read from it, "
                   "not from an API server watch")  # fmt: skip


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
