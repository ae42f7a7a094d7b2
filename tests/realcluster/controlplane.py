"""etcd, kube-apiserver, kube-scheduler and kube-controller-manager on loopback, in the order
and with the flags docs/testing.md lists ("Running Kubernetes 1.36 on one machine").

Everything lives in one private folder (certificates, kubeconfigs, etcd's data, logs) that
`stop()` removes after stopping each process by its PID, newest first. Ports are free ones
picked at start, so two sessions on one machine never meet.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.realcluster import binaries
from tests.realcluster.api import Api
from tests.realcluster.daemons import Daemon, wait_for
from tests.realcluster.pki import Pair, Pki

FEATURE_GATES = "--feature-gates=DRADeviceTaintRules=true"
"""DeviceTaintRule (beta and off in 1.36, GA and on in 1.37) on the API server, with
`resource.k8s.io/v1beta2` served (control-plane.md DRA item 8): the session's plane serves
the kind, so rule taints reach the exporter on every run (test_real_cluster_dra_sharing.py).
Not on the scheduler and controller manager: with the gate on there, the 1.36.2 scheduler
panicked once a rule existed ("interface conversion: interface {} is *v1beta2.DeviceTaintRule,
not *v1alpha3.DeviceTaintRule") and scheduled nothing more (docs/dra.md); off there, rules
are stored and served and act on nothing, which no other test here depends on."""
RUNTIME_CONFIG = "--runtime-config=resource.k8s.io/v1beta2=true"
NODE = "kde-rc-node"
"""The node name the tier's pods are bound to (and its kubelet registers as)."""
SERVICE_RANGE = "10.96.0.0/24"
ISSUER = "https://kubernetes.default.svc"
START_TIMEOUT = 60.0


def _free_ports(count: int) -> list[int]:
    """`count` consecutive free loopback ports (etcd's peer port is its client port + 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = int(s.getsockname()[1])
        held = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return list(range(first, first + count))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as resp:
            return bool(resp.read() == b"ok")
    except (urllib.error.URLError, OSError):
        return False


def _http_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def kubeconfig(path: Path, server: str, ca: Path, pair: Pair | None = None,
               token: str | None = None) -> Path:  # fmt: skip
    """A kubeconfig naming the files (client certificate) or holding a bearer token."""
    user: dict[str, str] = {}
    if pair is not None:
        user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    if token is not None:
        user["token"] = token
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kde",
        "clusters": [{"name": "kde", "cluster": {"server": server,
                                                 "certificate-authority": str(ca)}}],
        "users": [{"name": "kde", "user": user}],
        "contexts": [{"name": "kde", "context": {"cluster": "kde", "user": "kde"}}],
    }))  # fmt: skip
    path.chmod(0o600)
    return path


class ControlPlane:
    """Start with `start()`, always end with `stop()` (also after a failed start)."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="kde-rc-"))
        self.logs = self.dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.daemons: list[Daemon] = []
        self.timings: dict[str, float] = {}
        etcd_port, peer_port, self.api_port, sched_port, cm_port = _free_ports(5)
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        self.etcd_peer_url = f"http://127.0.0.1:{peer_port}"  # the shared etcd's: port + 1
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.ports = {"scheduler": sched_port, "controller-manager": cm_port}

    # --- what tests use ------------------------------------------------------------------

    def admin(self) -> Api:
        """A client in group system:masters (bypasses the authorizer)."""
        return Api(self.server, self.pki.ca, cert=(self.admin_pair.cert, self.admin_pair.key))

    def token_kubeconfig(self, path: Path, token: str) -> Path:
        return kubeconfig(path, self.server, self.pki.ca, token=token)

    def pids(self) -> list[int]:
        return [d.pid for d in self.daemons if d.proc is not None]

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> ControlPlane:
        began = time.monotonic()
        run = binaries.components()
        self._certificates()
        self.timings["certificates"] = time.monotonic() - began
        etcd = self._daemon("etcd", binaries.etcd_argv(self.dir / "etcd", self.etcd_url,
                                                       self.etcd_peer_url))  # fmt: skip
        wait_for("etcd /health", lambda: _http_healthy(self.etcd_url + "/health"),
                 START_TIMEOUT, [etcd])  # fmt: skip
        self.timings["etcd"] = time.monotonic() - began
        api = self._daemon("kube-apiserver", [*run["kube-apiserver"], *self._api_flags()])
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.admin_pair.cert), str(self.admin_pair.key))
        wait_for("kube-apiserver /readyz", lambda: _https_ok(self.server + "/readyz", context),
                 START_TIMEOUT, [etcd, api], interval=0.2)  # fmt: skip
        self.timings["kube-apiserver"] = time.monotonic() - began
        admin_kc = kubeconfig(self.dir / "admin.kubeconfig", self.server, self.pki.ca,
                              self.admin_pair)  # fmt: skip
        controllers = [
            self._daemon(name, [*run[name], *self._controller_flags(name, admin_kc)])
            for name in ("kube-scheduler", "kube-controller-manager")
        ]
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their serving certificates are self-signed
        for daemon, port in zip(controllers, self.ports.values(), strict=True):
            url = f"https://127.0.0.1:{port}/healthz"
            wait_for(f"{daemon.name} /healthz", functools.partial(_https_ok, url, insecure),
                     START_TIMEOUT, self.daemons, interval=0.2)  # fmt: skip
        self.timings["controllers"] = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Every daemon by its PID (newest first), then the whole folder."""
        errors = []
        for daemon in reversed(self.daemons):
            try:
                daemon.stop()
            except OSError as exc:
                errors.append(f"{daemon.name}: {exc}")
        shutil.rmtree(self.dir, ignore_errors=False)
        if errors:
            raise RuntimeError("stopping the control plane: " + "; ".join(errors))

    def _daemon(self, name: str, argv: list[str]) -> Daemon:
        daemon = Daemon(name, argv, self.logs).start()
        self.daemons.append(daemon)
        return daemon

    def _certificates(self) -> None:
        self.pki = Pki(self.dir / "pki")
        self.api_pair = self.pki.pair(
            "kube-apiserver",
            "/CN=kube-apiserver",
            ("IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes.default.svc"),
        )
        self.admin_pair = self.pki.pair("admin", "/CN=kde-admin/O=system:masters")
        self.sa_key = self.pki.rsa("service-account")

    def _api_flags(self) -> list[str]:
        return [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",  # 127.0.0.1 cannot be the Service's endpoint
            "--kubelet-preferred-address-types=Hostname",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            f"--client-ca-file={self.pki.ca}",
            f"--tls-cert-file={self.api_pair.cert}",
            f"--tls-private-key-file={self.api_pair.key}",
            f"--service-account-key-file={self.sa_key.cert}",
            f"--service-account-signing-key-file={self.sa_key.key}",
            f"--service-account-issuer={ISSUER}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--cert-dir={self.dir / 'apiserver-certs'}",
            FEATURE_GATES,
            RUNTIME_CONFIG,
        ]

    def _controller_flags(self, name: str, admin_kc: Path) -> list[str]:
        port = self.ports["scheduler" if name == "kube-scheduler" else "controller-manager"]
        flags = [
            f"--kubeconfig={admin_kc}",
            f"--authentication-kubeconfig={admin_kc}",
            f"--authorization-kubeconfig={admin_kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.dir / (name + '-certs')}",
        ]
        if name == "kube-controller-manager":
            flags += [
                f"--service-account-private-key-file={self.sa_key.key}",
                f"--root-ca-file={self.pki.ca}",
                "--use-service-account-credentials",
                f"--cluster-signing-cert-file={self.pki.ca}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
            ]
        return flags


@contextlib.contextmanager
def running(workdir: Path | None = None) -> Iterator[ControlPlane]:
    """A started control plane, stopped and removed however the block ends."""
    plane = ControlPlane(workdir)
    try:
        yield plane.start()
    finally:
        plane.stop()
