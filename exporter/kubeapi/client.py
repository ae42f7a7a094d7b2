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

Every answer is read through answers.py's bounds and decoders: bytes per body and per
watch line, pages and objects per list, time per read; a shape or encoding the API does
not have raises `Unusable`, never a KeyError or an AttributeError halfway through a list.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import yaml
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ConfigError

from exporter.kubeapi.answers import (
    Limits,
    Unusable,
    get,
    json_object,
    mapping,
    read_body,
    read_lines,
    sequence,
    text,
    within,
)
from exporter.kubeapi.pods import (
    OwnerRef,
    PodMeta,
    PodStatusReader,
    WatchEvent,
    controller_of,
    pod_meta,
)

ACCEPT_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
ACCEPT_OBJECT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
LIST_PAGE = 500

OWNER_RESOURCES = {"ReplicaSet": ("apps/v1", "replicasets"), "Job": ("batch/v1", "jobs")}
"""Owner kinds read once to find the workload above them (Deployment, CronJob)."""


class NotConfigured(Exception):
    """No usable kubeconfig or in-cluster configuration (only an operator fixes that)."""


UNAVAILABLE: tuple[type[BaseException], ...] = (
    httpx.HTTPError,
    OSError,
    TimeoutError,
    NotConfigured,
)
"""What a watch catches as "the API server is unavailable for now": transport errors, no
configuration yet; retried with back-off, never fatal. An answer that came but cannot be
used is `Unusable` (answers.py)."""


class ApiError(Exception):
    """An answer the API server gave: an HTTP status or a watch ERROR event's Status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code


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
    head = f"{type(exc).__name__}:{where}" if where else type(exc).__name__
    return f"{head}: {detail}" if detail else head


def _error(response: httpx.Response, body: bytes) -> ApiError:
    return ApiError(response.status_code, _error_message(body, response.reason_phrase))


def _error_message(body: bytes, reason: str) -> str:
    """An HTTP error's `Status` message (its first 200 bytes when it has none; `reason`
    when it is empty)."""
    try:
        message = json.loads(body).get("message", "")
    except (ValueError, AttributeError, RecursionError):
        message = None
    if not isinstance(message, str):
        message = body[:200].decode(errors="replace")
    return message[:500] or reason


def _status_error(obj: dict[str, Any]) -> ApiError:
    """A watch ERROR event's `Status` (410 Gone when the version is too old)."""
    code = obj.get("code")
    message = obj.get("message")
    return ApiError(
        code if isinstance(code, int) and 100 <= code < 600 else 500,
        message[:500] if isinstance(message, str) else "",
    )


class KubeApi:
    """Pods of one node and owner metadata; `requests` counts (verb, resource, code)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        pod_status: PodStatusReader | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.http = http
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.pod_status = pod_status
        """Given: list and watch whole pods, not their metadata, and read their DRA claims
        from their status with it (`--kubernetes.dra`, exporter/dra/claimhealth.py)."""
        self.limits = limits or Limits()
        """Bounds on every answer; `objects` is the pod list's (--kubernetes.max-pods)."""

    @property
    def full_pods(self) -> bool:
        return self.pod_status is not None

    async def close(self) -> None:
        await self.http.aclose()

    async def list_pods(self, node: str) -> tuple[list[PodMeta], str]:
        """Every pod on `node`, page by page; the list's resourceVersion to watch from."""
        accept = "application/json" if self.full_pods else ACCEPT_LIST
        params = {"fieldSelector": f"spec.nodeName={node}"}
        items, version = await self._list("pods", "/api/v1/pods", params, accept,
                                          limits=self.limits, what="pods",
                                          flag_name="--kubernetes.max-pods")  # fmt: skip
        return [pod_meta(item, self.pod_status) for item in items], version

    async def watch_pods(
        self,
        node: str,
        resource_version: str,
        timeout_seconds: int,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` until the server ends the watch (its timeout);
        `opened()` once the server accepted it (it sends everything after that version)."""
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
                raise _error(response, await read_body(response, self.limits.answer_bytes))
            if opened is not None:
                opened()
            async for line in read_lines(response, self.limits.answer_bytes):
                yield _watch_event(json_object(line, "a pod watch line"), self.pod_status)
        finally:
            await response.aclose()

    async def list_objects(
        self,
        resource: str,
        path: str,
        params: dict[str, str],
        limits: Limits | None = None,
        flag_name: str = "",
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of a list (whole objects, page by page): the DRA slices and rules;
        `limits.objects` (set by `flag_name`) bounds how many."""
        items, version = await self._list(resource, path, params, "application/json",
                                          limits=limits or self.limits, what=resource,
                                          flag_name=flag_name)  # fmt: skip
        return [mapping(item, f"a {resource} list item") for item in items], version

    async def _list(
        self,
        resource: str,
        path: str,
        params: dict[str, str],
        accept: str,
        *,
        limits: Limits,
        what: str,
        flag_name: str,
    ) -> tuple[list[Any], str]:
        """A list's items, page by page (at most `limits.pages`, `limits.objects` items);
        its resourceVersion."""
        items: list[Any] = []
        params = {**params, "limit": str(LIST_PAGE)}
        for _ in range(limits.pages):
            body = await self._get("list", resource, path, params, accept)
            items += sequence(body.get("items"), f"the {resource} list's items")
            limits.count(len(items), what, flag_name or "the limit")
            meta = mapping(body.get("metadata"), f"the {resource} list's metadata")
            more = text(meta.get("continue"), f"the {resource} list's continue token")
            if not more:
                version = meta.get("resourceVersion")
                return items, text(version, f"the {resource} list's resourceVersion")
            params["continue"] = more
        raise Unusable("pages", f"a {resource} list of more than {limits.pages} pages: dropped")

    async def watch_objects(
        self,
        resource: str,
        path: str,
        params: dict[str, str],
        timeout_seconds: int,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
        """(type, resourceVersion, object) of a watch of whole objects; ApiError on ERROR;
        `opened()` once the server accepted it."""
        params = {**params, "watch": "true", "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_seconds)}  # fmt: skip
        timeout = httpx.Timeout(self.http.timeout.connect, read=None)
        request = self.http.build_request("GET", path, params=params, timeout=timeout)
        response = await self._send("watch", resource, request)
        try:
            if response.status_code != 200:
                raise _error(response, await read_body(response, self.limits.answer_bytes))
            if opened is not None:
                opened()
            async for line in read_lines(response, self.limits.answer_bytes):
                event = json_object(line, f"a {resource} watch line")
                obj = mapping(event.get("object"), f"a {resource} watch event's object")
                kind = text(event.get("type"), f"a {resource} watch event's type")
                if kind == "ERROR":
                    raise _status_error(obj)
                version = text(get(obj, "metadata", "resourceVersion"),
                               f"a {resource} watch event's resourceVersion")  # fmt: skip
                yield kind, version, obj
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
        where = f"{kind} {namespace}/{name}"
        return controller_of(mapping(body.get("metadata"), f"{where}: metadata"), where)

    async def _get(
        self, verb: str, resource: str, path: str, params: dict[str, str], accept: str
    ) -> dict[str, Any]:
        """One answer, whole within `limits.read_seconds` and `limits.answer_bytes`."""
        what = f"{verb} {resource}"
        fetching = self._fetch(verb, resource, path, params, accept)
        response, body = await within(self.limits.read_seconds, f"the {what} answer", fetching)
        if response.status_code != 200:
            raise _error(response, body)
        return json_object(body, f"the {what} answer")

    async def _fetch(
        self, verb: str, resource: str, path: str, params: dict[str, str], accept: str
    ) -> tuple[httpx.Response, bytes]:
        request = self.http.build_request("GET", path, params=params, headers={"Accept": accept})
        response = await self._send(verb, resource, request)
        try:
            return response, await read_body(response, self.limits.answer_bytes)
        finally:
            await response.aclose()

    async def _send(self, verb: str, resource: str, request: httpx.Request) -> httpx.Response:
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            self.requests[(verb, resource, type(exc).__name__)] += 1
            raise
        self.requests[(verb, resource, str(response.status_code))] += 1
        return response


def _watch_event(event: dict[str, Any], status: PodStatusReader | None) -> WatchEvent:
    kind = text(event.get("type"), "a pod watch event's type")
    obj = mapping(event.get("object"), "a pod watch event's object")
    if kind == "ERROR":
        # A Status: 410 Gone when the resourceVersion is too old for the watch cache.
        raise _status_error(obj)
    version = text(get(obj, "metadata", "resourceVersion"), "a pod watch event's resourceVersion")
    if kind == "BOOKMARK":
        return WatchEvent(kind, version)
    return WatchEvent(kind, version, pod_meta(obj, status))
