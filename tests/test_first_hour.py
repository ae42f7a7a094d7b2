"""The first hour and the first apply, round three (issue 42): each stop-and-guess a new user
met, checked as the user meets it — the line a command prints, what a documented command
renders, what `make help` lists. (The landing page's used-without-request is in
tests/test_landing.py, the demo's doctor line in tests/test_simulate_runner.py, doctor's API
lines in tests/test_doctor.py.)"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli.flags import parse_config
from exporter.cli.main import main
from exporter.cli.parser import UsageError
from exporter.kubeapi.client import NotConfigured, describe
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario
from tests import kustomize
from tests.support.manifests import CHART, DEPLOY, ROOT, kit_with, render_chart

DEPLOY_MD = ROOT / "docs" / "deploy.md"


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


# --- 4 and 5: what the command line says -------------------------------------------------------


def test_help_for_a_command_that_does_not_exist_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no command 'bogus'" in err and "doctor" in err
    with pytest.raises(SystemExit) as done:
        main(["help", "doctor"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kube-device-exporter doctor")


def test_an_abbreviated_flag_is_refused_and_the_full_one_named() -> None:
    with pytest.raises(UsageError, match=r"unrecognized arguments: --web.listen :9405; did you "
                       r"mean --web.listen-address\?"):  # fmt: skip
        parse_config(["--web.listen", ":9405"], env={})


def test_no_http_server_and_no_otlp_endpoint_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError) as refused:
        parse_config(["--web.listen-address", "none"], env={})
    assert "\n" not in str(refused.value) and "nothing would be published" in str(refused.value)
    with pytest.raises(UsageError, match=r"^KDE_WEB_LISTEN_ADDRESS=none: "):
        parse_config([], env={"KDE_WEB_LISTEN_ADDRESS": "none"})
    pushing = ["--web.listen-address", "none", "--otlp.endpoint", "http://collector:4318"]
    assert (
        parse_config([*pushing, "--otlp.protocol", "http/protobuf"], env={}).listen_address is None
    )


def test_a_missing_tls_certificate_names_its_file(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(f"tls_server_config:\n  cert_file: {tmp_path}/tls.crt\n"
                      f"  key_file: {tmp_path}/tls.key\n")  # fmt: skip
    with pytest.raises(UsageError) as refused:
        parse_config(["--web.config.file", str(config)], env={})
    assert str(refused.value) == (
        f"--web.config.file {config}: tls_server_config.cert_file {tmp_path}/tls.crt: "
        "No such file or directory"
    )


def test_an_api_error_has_one_colon() -> None:
    said = describe(NotConfigured("no Kubernetes API configuration from x: y"))
    assert said == "NotConfigured: no Kubernetes API configuration from x: y"


def test_a_bad_boolean_says_every_word_it_accepts() -> None:
    with pytest.raises(UsageError) as refused:
        parse_config(["--collector.nvml.processes", "maybe"], env={})
    assert "expected true, false, yes, no, on, off, 1 or 0, got 'maybe'" in str(refused.value)
    assert parse_config(["--collector.nvml.processes", "yes"], env={})


def test_the_demo_scenarios_read_no_container_logs_of_this_machine(tmp_path: Path) -> None:
    """`kde-simulate mixed` and `dra` warned "no container-log directory at
    /var/log/containers" on a machine without one: every scenario's node names its own."""
    from exporter.attribution.resolver import ProcessResolver

    for name in ("mixed", "dra"):
        node = SimulatedNode(load_scenario(name), tmp_path / name)
        try:
            config = parse_config(node.exporter_args(), env={})
        finally:
            for part in node.parts:
                part.close()
        assert config.container_logs.is_relative_to(tmp_path / name), name
        assert (
            "container-log"
            not in ProcessResolver(config.procfs, config.container_logs)._unavailable()
        )


# --- 2: make help, and the chart rendered without a cluster ------------------------------------


@pytest.mark.peer
def test_make_help_lists_every_target() -> None:
    done = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    (phony,) = re.findall(r"^\.PHONY: (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    listed = set(re.findall(r"^make ([\w-]+)", done.stdout, re.MULTILINE))
    assert listed == set(phony.split())
    assert "{" not in done.stdout and "$(" not in done.stdout


def test_the_chart_renders_offline_as_deploy_md_says() -> None:
    """docs/deploy.md's `helm template` command, rendered by Helm's own library as the
    command does (install semantics, no cluster asked)."""
    (command,) = [b for b in blocks(DEPLOY_MD.read_text(), "sh") if "helm template" in b]
    words = command.replace("\\\n", " ").split()
    assert words[:4] == [
        "helm",
        "template",
        "kube-device-exporter",
        "deploy/helm/kube-device-exporter",
    ]
    values: dict[str, Any] = {}
    for flag, value in itertools.pairwise(words):
        if flag == "--set":
            key, _, text = value.partition("=")
            *path, last = key.split(".")
            node = values
            for part in path:
                node = node.setdefault(part, {})
            node[last] = text
    objects = render_chart(values)
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == "registry.example.com/kube-device-exporter:0.1.0"
    assert spec["runtimeClassName"] == "nvidia"
    assert (ROOT / words[3]).resolve() == CHART.resolve()


# --- the first apply: the kit's overlays of one's own --------------------------------------------


def _clone(where: Path) -> Path:
    """What the kit reads of a clone (deploy/, and the dashboards it packs), elsewhere."""
    for folder in ("deploy", "dashboards"):
        shutil.copytree(ROOT / folder, where / folder, symlinks=True)
    return where


@pytest.mark.peer
def test_the_image_overlay_example_renders_from_any_clone_location(tmp_path: Path) -> None:
    """docs/deploy.md's first overlay, in a clone that is not a sibling called
    kube-device-exporter (copied to another name and place), rendered by real kustomize."""
    (example,) = [b for b in blocks(DEPLOY_MD.read_text(), "yaml") if "images:" in b]
    clone = _clone(tmp_path / "somewhere" / "my-fork")
    (clone / "my-overlay").mkdir()
    (clone / "my-overlay" / "kustomization.yaml").write_text(example)
    objects = kustomize.build(clone / "my-overlay")
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/kube-device-exporter:0.1.0"


@pytest.mark.peer
def test_a_custom_kubelet_root_needs_no_prometheus_operator(tmp_path: Path) -> None:
    """The root-dir table's overlay of one's own (docs/deploy.md): both host paths moved, the
    mount points kept, and nothing of the Prometheus Operator's (copying the k0s overlay,
    as the docs said before, pulled in kube-prometheus-stack: CRDs missing, apply fails)."""
    (example,) = [b for b in blocks(DEPLOY_MD.read_text(), "yaml") if "/opt/kubelet" in b]
    clone = _clone(tmp_path / "clone")
    (clone / "my-overlay").mkdir()
    (clone / "my-overlay" / "kustomization.yaml").write_text(example)
    objects = kustomize.build(clone / "my-overlay")
    assert not [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com")]
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host["pod-resources"] == "/opt/kubelet/pod-resources"
    assert host["pods-api"] == "/opt/kubelet/pods-api"
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pods-api"] == "/var/lib/kubelet/pods-api"


def test_the_root_dir_table_says_where_each_host_path_goes() -> None:
    """Each row's two host paths are its root's, and the chart mounts them there."""
    table = DEPLOY_MD.read_text().split("### Kubelet root directories that differ", 1)[1]
    rows = [r for r in table.splitlines() if r.startswith("| ")][1:]
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        root = re.search(r"`([^`]+)`", cells[1])
        prefix = root.group(1) if root else "<root>"
        for cell, leaf in ((cells[2], "pod-resources"), (cells[3], "pods-api")):
            assert cell in (f"`{prefix}/{leaf}`", f"`<root>/{leaf}`"), row
    values = {"kubeletRootDir": "/opt/kubelet", "kubernetesApi": {"enabled": True, "podsApi": True}}
    (ds,) = [o for o in render_chart(values) if o["kind"] == "DaemonSet"]
    host = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in v}  # fmt: skip
    assert (host["pod-resources"], host["pods-api"]) == ("/opt/kubelet/pod-resources",
                                                         "/opt/kubelet/pods-api")  # fmt: skip


def test_the_readme_makes_the_namespace_for_the_chart_only() -> None:
    """The kit ships its Namespace, labelled: a `kubectl create namespace` before it made
    `kubectl apply` warn on every apply (the annotation apply keeps is missing)."""
    readme = (ROOT / "README.md").read_text()
    deploying = readme.split("## Deploying", 1)[1].split("\n## ", 1)[0]
    chart, kit = [b for b in blocks(deploying, "sh")]
    assert "kubectl create namespace" in chart and "helm install" in chart
    assert "kubectl create namespace" not in kit and "kubectl apply -k" in kit
    namespace = yaml.safe_load((DEPLOY / "base" / "namespace.yaml").read_text())
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.peer
def test_make_base_image_is_the_image_tests_stand_in() -> None:
    """docs/deploy.md's build without a registry: `make base-image` runs the recipe
    `make image-test` builds on (tests/image/base.py), with the same packages and mirror."""
    from tests.image.base import DEBIAN_MIRROR, PACKAGES

    done = subprocess.run(["make", "-n", "base-image"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert f"--include={','.join(PACKAGES)} bookworm" in done.stdout
    assert DEBIAN_MIRROR in done.stdout and "import" in done.stdout
    assert "make base-image" in DEPLOY_MD.read_text()


ADOPT_KINDS = {
    "ds": "DaemonSet", "svc": "Service", "sa": "ServiceAccount", "cm": "ConfigMap",
    "clusterrole": "ClusterRole", "clusterrolebinding": "ClusterRoleBinding",
    "servicemonitor": "ServiceMonitor", "podmonitor": "PodMonitor",
    "prometheusrule": "PrometheusRule",
}  # fmt: skip


@pytest.mark.peer
def test_the_chart_adoption_steps_cover_every_object_the_kit_made(tmp_path: Path) -> None:
    """Kit -> chart: `helm install` refuses an object it would render that exists without
    Helm's label and annotations. The steps in docs/deploy.md must reach every object the
    kit (with every optional component) and the chart (with every option) both have."""
    text = DEPLOY_MD.read_text()
    (steps,) = [b for b in blocks(text, "sh") if "managed-by=Helm" in b]
    sel = re.search(r"^sel=([\w./-]+)=([\w-]+)$", steps, re.M)
    assert sel is not None, steps
    selector = {sel.group(1): sel.group(2)}
    reached: dict[str, set[str]] = {"label": set(), "annotate": set()}
    for line in steps.splitlines():
        command = re.match(r"kubectl (?:-n \S+ )?(label|annotate) ([\w,]+) -l \$sel", line)
        if command:
            reached[command.group(1)] |= {ADOPT_KINDS[k] for k in command.group(2).split(",")}
    kit = kit_with(tmp_path, "kube-prometheus-stack", "kubernetes-api", "dra", "kubernetes-events")
    chart = render_chart({
        "kubernetesApi": {"enabled": True, "dra": True}, "kubernetesEvents": {"enabled": True},
        "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
        "dashboards": {"enabled": True},
    })  # fmt: skip
    rendered = {kustomize.key(o) for o in chart}
    shared = [o for o in kit if kustomize.key(o) in rendered]
    assert len(shared) >= 12
    for obj in shared:
        labels = obj["metadata"].get("labels", {})
        assert selector.items() <= labels.items(), kustomize.key(obj)
        for how in ("label", "annotate"):
            assert obj["kind"] in reached[how], (how, kustomize.key(obj))


# --- rollouts -------------------------------------------------------------------------------------


def _rolling(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    rolling: dict[str, Any] = ds["spec"]["updateStrategy"]["rollingUpdate"]
    return rolling


@pytest.mark.peer
def test_a_rollout_surges_on_the_pod_network_and_stops_first_on_the_host_network(
    tmp_path: Path,
) -> None:
    """On the pod network the new pod starts beside the old one (no scrape finds the node
    without an exporter); on the host network the port is the node's and the scheduler
    places no second pod on it (seen on the real 1.36 cluster: the surge pod stayed Pending
    and the rollout never ended), so the kit's component and the chart stop the old pod
    first. docs/deploy.md, section 5."""
    surge, first = {"maxSurge": 1, "maxUnavailable": 0}, {"maxSurge": 0, "maxUnavailable": 1}
    (tmp_path / "pods").mkdir()
    (tmp_path / "host").mkdir()
    assert _rolling(kit_with(tmp_path / "pods", "podmonitor")) == surge
    assert _rolling(kit_with(tmp_path / "host", "podmonitor", "host-network")) == first
    assert _rolling(render_chart()) == surge
    assert _rolling(render_chart({"hostNetwork": True})) == first
    mine = {"hostNetwork": True, "updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%"}}}
    assert _rolling(render_chart(mine)) == {"maxSurge": 0, "maxUnavailable": "10%"}
