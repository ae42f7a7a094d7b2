"""The Kubernetes API calls the pod watch needs, metadata only, each one counted.

lightkube provides what is hard to get right and must match kubectl: kubeconfig and
in-cluster configuration, the service-account token file re-read when it rotates, exec
credential plugins, TLS. Its `watch()` is not used: it cannot ask for bookmarks, and on
`410 Gone` it re-watches from "now" without re-listing, which never reports the pods
deleted in the gap. The list/watch protocol is driven here instead (client-go does the
same: its Reflector is separate from the REST client).

Every call asks for `PartialObjectMetadata` (client-go's metadata informer): labels, UID
and owner references are metadata, and a pod's spec and status (often tens of KB, changing
on every probe) never cross the wire. A server that does not offer it answers plain JSON,
which parses the same.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import yaml
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ConfigError

from exporter.model import ClaimHealth, ExtendedClaim

ACCEPT_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
ACCEPT_OBJECT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
LIST_PAGE = 500

OWNER_RESOURCES = {"ReplicaSet": ("apps/v1", "replicasets"), "Job": ("batch/v1", "jobs")}
"""Owner kinds read once to find the workload above them (Deployment, CronJob)."""


PodStatusReader = Callable[
    [dict[str, Any]], tuple[tuple[ClaimHealth, ...], tuple[ExtendedClaim, ...]]
]
"""What a whole pod's status says of its DRA claims (`exporter.dra.claimhealth
.read_pod_status`), handed in by the composition root with `--kubernetes.dra`."""


class NotConfigured(Exception):
    """No usable kubeconfig or in-cluster configuration (only an operator fixes that)."""


UNAVAILABLE: tuple[type[BaseException], ...] = (
    httpx.HTTPError,
    OSError,
    ValueError,
    KeyError,
    TimeoutError,
    NotConfigured,
)
"""What a watch catches as "the API server is unavailable for now": transport errors, a
body that does not parse, no configuration yet; retried with back-off, never fatal."""


class ApiError(Exception):
    """An answer the API server gave: an HTTP status or a watch ERROR event's Status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PodMeta:
    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...] = ()
    owner: OwnerRef | None = None
    """The controlling owner reference (`controller: true`), if any."""
    health: tuple[ClaimHealth, ...] = ()
    """Its claims' `allocatedResourcesStatus`, when whole pods are read (`pod_status`)."""
    extended: tuple[ExtendedClaim, ...] = ()
    """Its `extendedResourceClaimStatus` (KEP-5004), when whole pods are read."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED or BOOKMARK (the Pods API: INITIAL_SYNC_COMPLETE, no version)."""
    resource_version: str
    pod: PodMeta | None = None
    """None for a BOOKMARK or INITIAL_SYNC_COMPLETE."""


def controller_of(meta: dict[str, Any]) -> OwnerRef | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return OwnerRef(str(ref.get("kind", "")), str(ref.get("name", "")), str(ref["uid"]))
    return None


def pod_meta(obj: dict[str, Any], status: PodStatusReader | None = None) -> PodMeta:
    meta = obj["metadata"]
    health, extended = status(obj) if status is not None else ((), ())
    labels = meta.get("labels") or {}
    return PodMeta(
        namespace=str(meta.get("namespace", "")),
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        owner=controller_of(meta),
        health=health,
        extended=extended,
    )


def load_config(kubeconfig: Path | None) -> Any:
    """lightkube's SingleConfig: the kubeconfig's current context, or in-cluster."""
    try:
        if kubeconfig is not None:
            return KubeConfig.from_file(kubeconfig).get()
        return KubeConfig.from_service_account().get()
    except (
        ConfigError,
        OSError,
        ValueError,
        LookupError,
        TypeError,
        AttributeError,
        yaml.YAMLError,
    ) as exc:
        # A malformed kubeconfig fails inside lightkube with whatever its YAML or dict
        # access raises; one line, the parser's first line of it.
        where = kubeconfig or "in-cluster (no ServiceAccount token mounted?)"
        what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotConfigured(f"no Kubernetes API configuration from {where}: {what}") from exc


def http_client(config: Any, timeout: float) -> httpx.AsyncClient:
    quiet_http_logs()
    params = client_adapter.ConnectionParams(timeout=httpx.Timeout(timeout), trust_env=False)
    return client_adapter.AsyncClient(config, params)


HTTP_LOGGERS = ("httpx2", "httpcore2")


def quiet_http_logs() -> None:
    """The HTTP library logs every request at INFO: a line per watch and owner read, for
    ever, in every pod (seen in the real cluster's exporter log). The requests are counted
    in `kubernetes_requests_total`; at `--log-level debug` the lines stay."""
    debug = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.WARNING)


def describe(exc: BaseException) -> str:
    """What failed, where and why, in one line: `ConnectTimeout: GET https://10.96.0.1:443/
    api/v1/pods: no answer within 10s` (httpx's own text is empty for timeouts)."""
    where = ""
    if isinstance(exc, httpx.RequestError):
        with contextlib.suppress(RuntimeError):  # .request is unset on some errors
            request = exc.request
            where = f" {request.method} {request.url.copy_with(query=None)}"
    detail = str(exc) or str(exc.__cause__ or "")
    if not detail and isinstance(exc, httpx.TimeoutException):
        detail = "no answer in time"
    return f"{type(exc).__name__}:{where}" + (f": {detail}" if detail else "")


def _error(response: httpx.Response, body: bytes) -> ApiError:
    try:
        message = str(json.loads(body).get("message", ""))
    except ValueError:
        message = body[:200].decode(errors="replace")
    return ApiError(response.status_code, message or response.reason_phrase)


class KubeApi:
    """Pods of one node and owner metadata; `requests` counts (verb, resource, code)."""

    def __init__(
        self, http: httpx.AsyncClient, *, pod_status: PodStatusReader | None = None
    ) -> None:
        self.http = http
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.pod_status = pod_status
        """Given: list and watch whole pods, not their metadata, and read their DRA claims
        from their status with it (`--kubernetes.dra`, exporter/dra/claimhealth.py)."""

    @property
    def full_pods(self) -> bool:
        return self.pod_status is not None

    async def close(self) -> None:
        await self.http.aclose()

    async def list_pods(self, node: str) -> tuple[list[PodMeta], str]:
        """Every pod on `node`, page by page; the list's resourceVersion to watch from."""
        pods: list[PodMeta] = []
        params = {"fieldSelector": f"spec.nodeName={node}", "limit": str(LIST_PAGE)}
        while True:
            accept = "application/json" if self.full_pods else ACCEPT_LIST
            body = await self._get("list", "pods", "/api/v1/pods", params, accept)
            pods += [pod_meta(item, self.pod_status) for item in body.get("items") or ()]
            meta = body.get("metadata") or {}
            if not meta.get("continue"):
                return pods, str(meta.get("resourceVersion", ""))
            params["continue"] = str(meta["continue"])

    async def watch_pods(
        self, node: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` until the server ends the watch (its timeout)."""
        params = {
            "watch": "true",
            "fieldSelector": f"spec.nodeName={node}",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        timeout = httpx.Timeout(self.http.timeout.connect, read=None)
        accept = "application/json" if self.full_pods else ACCEPT_OBJECT
        request = self.http.build_request(
            "GET", "/api/v1/pods", params=params, headers={"Accept": accept}, timeout=timeout
        )
        response = await self._send("watch", "pods", request)
        try:
            if response.status_code != 200:
                raise _error(response, await response.aread())
            async for line in response.aiter_lines():
                if line.strip():
                    yield _watch_event(json.loads(line), self.pod_status)
        finally:
            await response.aclose()

    async def list_objects(
        self, resource: str, path: str, params: dict[str, str]
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of a list (whole objects, page by page): the DRA slices and rules."""
        items: list[dict[str, Any]] = []
        params = {**params, "limit": str(LIST_PAGE)}
        while True:
            body = await self._get("list", resource, path, params, "application/json")
            items += list(body.get("items") or ())
            meta = body.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = str(meta["continue"])

    async def watch_objects(
        self, resource: str, path: str, params: dict[str, str], timeout_seconds: int
    ) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
        """(type, resourceVersion, object) of a watch of whole objects; ApiError on ERROR."""
        params = {**params, "watch": "true", "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_seconds)}  # fmt: skip
        timeout = httpx.Timeout(self.http.timeout.connect, read=None)
        request = self.http.build_request("GET", path, params=params, timeout=timeout)
        response = await self._send("watch", resource, request)
        try:
            if response.status_code != 200:
                raise _error(response, await response.aread())
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("message", "")))
                version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                yield str(event.get("type", "")), version, obj
        finally:
            await response.aclose()

    async def get_object(self, resource: str, path: str) -> dict[str, Any]:
        """One whole object (a ResourceClaim the DRA view reads)."""
        return await self._get("get", resource, path, {}, "application/json")

    async def controller_of(self, namespace: str, kind: str, name: str) -> OwnerRef | None:
        """The controlling owner of a ReplicaSet or Job (None: it has none)."""
        api_version, resource = OWNER_RESOURCES[kind]
        path = f"/apis/{api_version}/namespaces/{namespace}/{resource}/{name}"
        body = await self._get("get", resource, path, {}, ACCEPT_OBJECT)
        return controller_of(body.get("metadata") or {})

    async def _get(
        self, verb: str, resource: str, path: str, params: dict[str, str], accept: str
    ) -> dict[str, Any]:
        request = self.http.build_request("GET", path, params=params, headers={"Accept": accept})
        response = await self._send(verb, resource, request)
        try:
            body = await response.aread()
        finally:
            await response.aclose()
        if response.status_code != 200:
            raise _error(response, body)
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ApiError(response.status_code, "answer is not a JSON object")
        return data

    async def _send(self, verb: str, resource: str, request: httpx.Request) -> httpx.Response:
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            self.requests[(verb, resource, type(exc).__name__)] += 1
            raise
        self.requests[(verb, resource, str(response.status_code))] += 1
        return response


def _watch_event(event: dict[str, Any], status: PodStatusReader | None) -> WatchEvent:
    kind = str(event.get("type", ""))
    obj = event.get("object") or {}
    if kind == "ERROR":
        # A Status: 410 Gone when the resourceVersion is too old for the watch cache.
        raise ApiError(int(obj.get("code") or 500), str(obj.get("message", "")))
    version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
    if kind == "BOOKMARK":
        return WatchEvent(kind, version)
    return WatchEvent(kind, version, pod_meta(obj, status))
