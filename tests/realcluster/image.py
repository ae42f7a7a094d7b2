"""The image deployed on the real cluster as a user deploys it.

`built()` builds the Dockerfile with tests/image's harness (Debian's docker.io, the pinned
base or its Debian stand-in, the same build arguments as tests/test_image.py); `load()`
hands it to the cluster node's containerd as `docker save | ctr -n k8s.io images import`
does; `kit()` and `chart()` render deploy/ (real kustomize) and the Helm chart (Helm's own
library) with only the overlay this cluster needs:

- host network (components/host-network, chart `hostNetwork`): containerd here has no pod
  network (docs/testing.md);
- the kubelet's root directory, which is the node's own folder here (chart `kubeletRootDir`,
  kit: the pod-resources hostPath, as overlays/k0s patches it);
- a metrics port of our own (a host-network pod shares the machine's ports with other
  tests; chart `service.port`, kit: containerPort and `KDE_WEB_LISTEN_ADDRESS`);
- with the API: `KUBERNETES_SERVICE_HOST/PORT` naming the API server on loopback: this
  cluster has no kube-proxy, so the `kubernetes` Service's address that the kubelet puts in
  every pod's environment leads nowhere (a container's own env wins over it);
- the image by its local tag with `imagePullPolicy: Never` (no registry).

And the part the NVIDIA container toolkit plays on a GPU node: `driver` (a `Driver`) mounts
the simulated libnvidia-ml and its state read-only at their own paths and names them in the
environment, as tests/test_image.py does for `docker run` (kit: a patch; chart:
`extraVolumes`, `extraVolumeMounts`, `extraEnv`). Without it the node's `nvidia.com/gpu`
devices are seen by no source, which `doctor` rightly calls a problem.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import yaml

from tests import kustomize
from tests.image import base
from tests.image.engine import Engine, engine_or_reason
from tests.realcluster.node import ClusterNode

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "kube-device-exporter"
CA_BUNDLE = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
REPOSITORY = "docker.io/library/kde-cluster-image"


@dataclass(frozen=True)
class Driver:
    """What the toolkit would inject: host folders to mount read-only, and environment."""

    folders: tuple[Path, ...]
    env: dict[str, str]

    def volumes(self) -> list[dict[str, Any]]:
        return [{"name": f"driver-{i}", "hostPath": {"path": str(f), "type": "Directory"}}
                for i, f in enumerate(self.folders)]  # fmt: skip

    def mounts(self) -> list[dict[str, Any]]:
        return [{"name": f"driver-{i}", "mountPath": str(f), "readOnly": True}
                for i, f in enumerate(self.folders)]  # fmt: skip

    def env_list(self) -> list[dict[str, str]]:
        return [{"name": k, "value": v} for k, v in sorted(self.env.items())]


@dataclass
class Built:
    engine: Engine
    tag: str
    """`REPOSITORY:TAG`: the name containerd knows it by after the import."""
    build_seconds: float


def build(workdir: Path) -> Built | str:
    """The image built, or the one line that says why it cannot be here."""
    engine = engine_or_reason(workdir)
    if isinstance(engine, str):
        return engine
    tag = f"{REPOSITORY}:{os.getpid()}"
    pinned = base.ensure(engine, ROOT / "Dockerfile", workdir)
    args = ["--build-arg", f"PYTHON_IMAGE={pinned.ref}", "--build-arg", "REVISION=cluster-test",
            "--build-arg", "SOURCE=cluster-test"]  # fmt: skip
    if CA_BUNDLE.exists():
        args += ["--secret", f"id=pip-ca,src={CA_BUNDLE}"]
    began = time.monotonic()
    engine.run("build", "--progress=plain", *args, "-t", tag, str(ROOT), timeout=900)
    return Built(engine, tag, time.monotonic() - began)


def load(built: Built, node: ClusterNode) -> None:
    """`docker save TAG | ctr -n k8s.io images import -` into the node's containerd."""
    save = subprocess.Popen([built.engine.cli, "save", built.tag], stdout=subprocess.PIPE,
                            env=built.engine.env)  # fmt: skip
    assert save.stdout is not None
    containerd = node.node.containerd
    try:
        imported = subprocess.run(
            [containerd.tools.ctr, "--address", str(containerd.socket), "-n", "k8s.io",
             "images", "import", "-"],
            stdin=save.stdout, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        save.stdout.close()
        save.wait(timeout=120)
    assert save.returncode == 0 and imported.returncode == 0, imported.stderr
    assert built.tag in containerd.images()


def _api_env(server: str) -> list[dict[str, str]]:
    where = urlsplit(server)
    return [{"name": "KUBERNETES_SERVICE_HOST", "value": str(where.hostname)},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(where.port)}]  # fmt: skip


def kit(built: Built, node: ClusterNode, port: int, *, server: str | None,
        driver: Driver) -> list[dict[str, Any]]:  # fmt: skip
    """deploy/base (+ components/kubernetes-api when `server`) + components/host-network and
    the patches above, as `kubectl kustomize` renders the user's overlay."""
    repository, tag = built.tag.rsplit(":", 1)
    container = "/spec/template/spec/containers/0"
    env = [{"name": "KDE_WEB_LISTEN_ADDRESS", "value": f":{port}"},
           *(_api_env(server) if server else []), *driver.env_list()]  # fmt: skip
    spec = "/spec/template/spec"
    patch = [
        {"op": "replace", "path": f"{container}/imagePullPolicy", "value": "Never"},
        {"op": "replace", "path": f"{container}/ports/0/containerPort", "value": port},
        *({"op": "add", "path": f"{container}/env/-", "value": e} for e in env),
        *({"op": "add", "path": f"{container}/volumeMounts/-", "value": m}
          for m in driver.mounts()),
        *({"op": "add", "path": f"{spec}/volumes/-", "value": v} for v in driver.volumes()),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kde-kit-image-") as tmp:
        mine = Path(tmp)
        components = ["host-network", *(["kubernetes-api"] if server else [])]
        doc = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / "base", mine)],
            "components": [os.path.relpath(DEPLOY / "components" / c, mine) for c in components],
            "images": [{"name": "kube-device-exporter", "newName": repository, "newTag": tag}],
            "patches": [
                {"target": {"kind": "DaemonSet", "name": "kube-device-exporter"},
                 "patch": yaml.safe_dump(patch)},
                {"path": "kubelet-root.yaml"},
            ],
        }  # fmt: skip
        root = {"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "kube-device-exporter", "namespace": "kube-device-exporter"},
                "spec": {"template": {"spec": {"volumes": [
                    {"name": "pod-resources", "hostPath": {
                        "path": str(node.kubelet.root_dir / "pod-resources"),
                        "type": "DirectoryOrCreate"}}]}}}}  # fmt: skip
        (mine / "kubelet-root.yaml").write_text(yaml.safe_dump(root))
        (mine / "kustomization.yaml").write_text(yaml.safe_dump(doc))
        return kustomize.build(mine)


def chart(built: Built, node: ClusterNode, port: int, release: str, namespace: str, *,
          server: str | None, driver: Driver) -> list[dict[str, Any]]:  # fmt: skip
    """The chart as `helm template` renders it with the values above."""
    repository, tag = built.tag.rsplit(":", 1)
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "kubeletRootDir": str(node.kubelet.root_dir),
        "hostNetwork": True,
        "service": {"port": port},
        "kubernetesApi": {"enabled": server is not None},
        "extraEnv": [*(_api_env(server) if server else []), *driver.env_list()],
        "extraVolumes": driver.volumes(),
        "extraVolumeMounts": driver.mounts(),
    }
    with helm.Chart.load(CHART) as loaded:
        out = loaded.render(values, name=release, namespace=namespace, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs
