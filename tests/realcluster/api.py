"""A small REST client for the tests: JSON over HTTPS with a client certificate or a bearer
token, and the paths of the kinds the tests create. Deliberately not the exporter's client
(exporter/kubeapi), so a bug there cannot hide itself in the tests."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("v1", "namespaces", False),
    "Node": ("v1", "nodes", False),
    "Pod": ("v1", "pods", True),
    "Service": ("v1", "services", True),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Deployment": ("apps/v1", "deployments", True),
    "ReplicaSet": ("apps/v1", "replicasets", True),
    "StatefulSet": ("apps/v1", "statefulsets", True),
    "DaemonSet": ("apps/v1", "daemonsets", True),
    "Job": ("batch/v1", "jobs", True),
    "CronJob": ("batch/v1", "cronjobs", True),
    "RuntimeClass": ("node.k8s.io/v1", "runtimeclasses", False),
    "ResourceSlice": ("resource.k8s.io/v1", "resourceslices", False),
    "DeviceClass": ("resource.k8s.io/v1", "deviceclasses", False),
    "ResourceClaim": ("resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("resource.k8s.io/v1", "resourceclaimtemplates", True),
    "DeviceTaintRule": ("resource.k8s.io/v1beta2", "devicetaintrules", False),
}
"""kind -> (apiVersion, resource, namespaced)."""


class ApiStatus(Exception):
    def __init__(self, code: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{code} {message}")
        self.code = code
        self.body = body


def collection(kind: str, namespace: str = "") -> str:
    version, resource, namespaced = RESOURCES[kind]
    base = "/api/v1" if version == "v1" else f"/apis/{version}"
    if namespaced:
        return f"{base}/namespaces/{namespace}/{resource}"
    return f"{base}/{resource}"


def path_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{collection(obj['kind'], meta.get('namespace', ''))}/{meta['name']}"


class Api:
    def __init__(
        self,
        server: str,
        ca: Path,
        *,
        cert: tuple[Path, Path] | None = None,
        token: str | None = None,
    ) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=str(ca))
        if cert is not None:
            self.context.load_cert_chain(str(cert[0]), str(cert[1]))
        self.token = token
        self.warnings: list[str] = []
        """The `Warning` headers of the last successful answer (admission warnings)."""

    def as_token(self, token: str) -> Api:
        """The same server, authenticated by `token` alone (no client certificate)."""
        api = Api.__new__(Api)
        api.server, api.token, api.warnings = self.server, token, []
        api.context = ssl.create_default_context()
        api.context.load_verify_locations(cadata=self._ca_data())
        return api

    def _ca_data(self) -> str:
        certs = self.context.get_ca_certs(binary_form=True)
        return "".join(ssl.DER_cert_to_PEM_cert(c) for c in certs)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float = 10.0,
    ) -> Any:
        url = self.server + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", accept)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=timeout) as resp:
                raw = resp.read()
                self.warnings = resp.headers.get_all("Warning") or []
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise ApiStatus(exc.code, parsed) from None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params=params or None)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        result: dict[str, Any] = self.request(
            "POST", collection(obj["kind"], meta.get("namespace", "")), obj
        )
        return result

    def apply(self, obj: dict[str, Any], manager: str = "kde-e2e") -> dict[str, Any]:
        """Server-side apply (create or update), as `kubectl apply --server-side` does."""
        result: dict[str, Any] = self.request(
            "PATCH",
            path_of(obj),
            obj,
            params={"fieldManager": manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )
        return result

    def delete(self, obj: dict[str, Any], propagation: str = "Background") -> None:
        """Delete, tolerating an object that is already gone."""
        try:
            self.request("DELETE", path_of(obj), {"propagationPolicy": propagation})
        except ApiStatus as exc:
            if exc.code != 404:
                raise


def namespace(api: Api, name: str, timeout: float = 20.0) -> None:
    """Create `name` and wait for its `default` ServiceAccount: the ServiceAccount admission
    plugin refuses pods until the controller manager has made it (a real API server's
    behaviour the loopback one has no notion of)."""
    from tests.realcluster.daemons import wait_for

    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def has_default() -> bool:
        try:
            api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
        except ApiStatus as exc:
            if exc.code == 404:
                return False
            raise
        return True

    wait_for(f"namespace {name}'s default ServiceAccount", has_default, timeout)
