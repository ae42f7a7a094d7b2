"""The image, built and run: Debian's docker.io builds the Dockerfile (on its pinned base,
or a stand-in made from Debian packages under the base's name where no registry answers)
and runs it as deploy/base/daemonset.yaml does (user, capabilities, read-only root, limits,
environment, mounts) against the simulated node: /metrics with pod labels, `doctor`
inside, SIGTERM. The contents: no pip or setuptools, every module compiled at build, the
OCI labels, the LICENSE, the deployed user; a rebuild from the lock installs the same set.

Skipped with one line where no Docker daemon runs or can be started (not root, no dockerd).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.image import base, daemonset
from tests.image.engine import Engine, engine_or_reason

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parent.parent
DAEMONSET = ROOT / "deploy" / "base" / "daemonset.yaml"
CA_BUNDLE = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
NODE = "demo-node-1"
READY_WITHIN = 30.0

# One walk over the runtime environment: every installed distribution with its version and
# its RECORD's digest, and every file's digest (the .pyc files included).
INVENTORY = r"""
import hashlib, importlib.metadata as md, json, os, re
venv = "/opt/kube-device-exporter"
dists = {}
for d in md.distributions(path=[p for p in __import__("sys").path if p.startswith(venv)]):
    record = d.read_text("RECORD") or ""
    dists[re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()] = [d.version, hashlib.sha256(record.encode()).hexdigest()]
files = {}
for top, _, names in os.walk(venv):
    for name in names:
        path = os.path.join(top, name)
        if not os.path.islink(path):
            files[path] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps({"dists": dists, "files": files}))
"""

# Every .py of the environment and of the standard library with its .pyc beside it.
UNCOMPILED = r"""
import importlib.util, json, os, sys, sysconfig
roots = ["/opt/kube-device-exporter", sysconfig.get_path("stdlib")]
missing, total = [], 0
for root in roots:
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("test", "tests", "idlelib", "lib2to3")]
        for name in names:
            if name.endswith(".py"):
                total += 1
                source = os.path.join(top, name)
                if not os.path.exists(importlib.util.cache_from_source(source)):
                    missing.append(source)
print(json.dumps({"total": total, "missing": missing}))
"""


@dataclass
class Built:
    engine: Engine
    tag: str
    base: base.Base
    build_args: list[str]
    build_seconds: float
    workdir: Path


def _build(engine: Engine, tag: str, build_args: list[str], *extra: str) -> float:
    started = time.monotonic()
    engine.run("build", "--progress=plain", *build_args, *extra, "-t", tag, str(ROOT),
               timeout=900)  # fmt: skip
    return time.monotonic() - started


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    workdir = Path(tempfile.mkdtemp(prefix="kde-img-", dir="/tmp"))
    engine = engine_or_reason(workdir)
    if isinstance(engine, str):
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip(f"image test: {engine}")
    tag = f"kde-image-test:{os.getpid()}"
    try:
        pinned = base.ensure(engine, ROOT / "Dockerfile", workdir)
        print(f"image test base: {pinned.how}")
        build_args = ["--build-arg", f"PYTHON_IMAGE={pinned.ref}",
                      "--build-arg", "REVISION=image-test", "--build-arg", "SOURCE=image-test"]  # fmt: skip
        if CA_BUNDLE.exists():
            build_args += ["--secret", f"id=pip-ca,src={CA_BUNDLE}"]
        seconds = _build(engine, tag, build_args)
        print(f"image build: {seconds:.1f} s")
        yield Built(engine, tag, pinned, build_args, seconds, workdir)
    finally:
        engine.run("rmi", "--force", tag, check=False)
        engine.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _python(built: Built, code: str, tag: str | None = None) -> str:
    return built.engine.run(
        "run", "--rm", "--read-only", "--network", "none", "--entrypoint", "python",
        tag or built.tag, "-c", code,
    ).stdout  # fmt: skip


@contextlib.contextmanager
def simulated_node(workdir: Path) -> Iterator[dict[str, list[str] | dict[str, str]]]:
    """`kde-simulate demo --node-only` on the host: the kubelet socket, NVML state, /proc, logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KDE_", "LD_LIBRARY"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "demo", "--node-only"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**env, "TMPDIR": str(workdir)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                yield json.loads(line)
                break
        else:
            raise AssertionError(f"the simulated node did not start: {proc.communicate()[1]}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_runs_as_the_daemonset_against_the_simulated_node(built: Built) -> None:
    with simulated_node(built.workdir) as node:
        env, args = node["env"], node["args"]
        assert isinstance(env, dict) and isinstance(args, list)
        work = Path(_arg(args, "--kubelet-socket")).parent.parent
        host_paths = {
            "pod-resources": work / "pod-resources",
            "sys": Path(_arg(args, "--path.sysfs")),
            "proc": Path(_arg(args, "--path.procfs")),
            "container-logs": Path(_arg(args, "--path.container-logs")),
        }
        flags = daemonset.run_flags(DAEMONSET, host_paths, NODE)
        # The NVIDIA toolkit's part on a node: the driver's libnvidia-ml (here the simulated
        # one) and its state, read-only, at the paths the simulated node names.
        library, state = Path(env["LD_LIBRARY_PATH"]), Path(env["KDE_FAKENVML_STATE"]).parent
        for path in (library, state):
            flags += ["--volume", f"{path}:{path}:ro"]
        flags += ["--env", f"LD_LIBRARY_PATH={library}",
                  "--env", f"KDE_FAKENVML_STATE={env['KDE_FAKENVML_STATE']}"]  # fmt: skip
        name = f"kde-image-test-{os.getpid()}"
        engine = built.engine
        started = time.monotonic()
        engine.run("run", "--detach", "--name", name, *flags, built.tag,
                   "--collect-interval", "2s", "--collector.netdev.vf-netlink", "false")  # fmt: skip
        try:
            ip = engine.run("inspect", "--format", "{{.NetworkSettings.IPAddress}}", name).stdout
            url = f"http://{ip.strip()}:{daemonset.port(DAEMONSET)}"
            deadline, status = started + READY_WITHIN, 0
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    status, _ = _get(f"{url}/readyz")
                if status == 200:
                    break
                time.sleep(0.1)
            ready = time.monotonic() - started
            logs = engine.run("logs", name).stderr
            assert status == 200, f"not ready within {READY_WITHIN} s: {logs[-3000:]}"
            print(f"image ready in {ready:.2f} s (docker run to /readyz 200)")

            status, metrics = _get(f"{url}/metrics")
            assert status == 200
            up = re.search(
                r'^kube_device_exporter_podresources_up\{api_version="v1",k8s_node_name="demo-node-1"\} (\S+)$',
                metrics,
                re.M,
            )
            seen = [x for x in metrics.splitlines() if "podresources_up" in x]
            assert up and float(up.group(1)) == 1.0, f"root without caps reads the socket: {seen}"
            trainer = re.search(
                r'^hw_gpu_utilization_ratio\{hw_gpu_task="general",[^}]*'
                r'k8s_namespace_name="ml-team",k8s_node_name="demo-node-1",'
                r'k8s_pod_name="trainer-0"\} (\S+)$', metrics, re.M,
            )  # fmt: skip
            assert trainer and 0 < float(trainer.group(1)) <= 1, "NVML joined to the pod"

            doctor = engine.run("exec", name, "kube-device-exporter", "doctor", check=False)
            assert doctor.returncode == 0, doctor.stdout + doctor.stderr
            assert "every device the node advertises is seen" in doctor.stdout
            assert re.search(r"^OK\s+kubelet\s.*19 pods", doctor.stdout, re.M), doctor.stdout

            killed = time.monotonic()
            engine.run("kill", "--signal", "TERM", name)
            code = engine.run("wait", name, timeout=60).stdout.strip()
            stopped = time.monotonic() - killed
            grace = daemonset.grace_seconds(DAEMONSET)
            print(f"SIGTERM to exit: {stopped:.2f} s (grace {grace} s), exit {code}")
            assert code == "0" and stopped < grace / 2
            logs = engine.run("logs", name).stderr
            assert "Traceback" not in logs and "Read-only file system" not in logs, logs
        finally:
            engine.run("rm", "--force", name, check=False)


def test_contents_labels_license_and_user(built: Built) -> None:
    spec = json.loads(_python(built, r"""
import importlib.util, json
print(json.dumps([m for m in ("pip", "setuptools", "wheel", "pkg_resources")
                  if importlib.util.find_spec(m)]))"""))  # fmt: skip
    assert spec == [], f"in the runtime stage: {spec}"
    compiled = json.loads(_python(built, UNCOMPILED))
    assert compiled["total"] > 1000 and compiled["missing"] == [], compiled["missing"][:20]

    config = json.loads(built.engine.run("image", "inspect", built.tag).stdout)[0]["Config"]
    labels = config["Labels"]
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert labels["org.opencontainers.image.version"] == version.group(1)
    assert labels["org.opencontainers.image.revision"] == "image-test"
    assert labels["org.opencontainers.image.source"] == "image-test"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    license_text = _python(
        built, "print(open('/usr/share/doc/kube-device-exporter/LICENSE').read(), end='')"
    )
    assert license_text == (ROOT / "LICENSE").read_text()
    pod, container = daemonset.load(DAEMONSET)
    run_as = {**pod["securityContext"], **container["securityContext"]}
    assert config["User"] == f"{run_as['runAsUser']}:{run_as['runAsGroup']}", "as deployed"


def test_a_rebuild_from_the_lock_installs_the_same_set(built: Built) -> None:
    again = f"{built.tag}-again"
    try:
        seconds = _build(built.engine, again, built.build_args, "--no-cache")
        first, second = (
            json.loads(_python(built, INVENTORY)),
            json.loads(_python(built, INVENTORY, again)),
        )
    finally:
        built.engine.run("rmi", "--force", again, check=False)
    print(f"rebuild without cache: {seconds:.1f} s, {len(first['dists'])} distributions, "
          f"{len(first['files'])} files")  # fmt: skip
    lock = (ROOT / "requirements" / "runtime.lock").read_text()
    pins = dict(re.findall(r"^([a-z0-9_.-]+)==(\S+)", lock, re.M))
    versions = {name: v for name, (v, _) in first["dists"].items()}
    assert versions == {**pins, "kube-device-exporter": versions["kube-device-exporter"]}
    assert first["dists"] == second["dists"]
    differ = sorted(p for p in first["files"] if first["files"][p] != second["files"].get(p))
    assert first["files"].keys() == second["files"].keys() and differ == [], differ[:20]
