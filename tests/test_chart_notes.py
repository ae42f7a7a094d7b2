"""What `helm install` prints: the label contract (docs/deploy.md, Node selection), since a
device node without one of the selected labels gets no pod and nothing else says so (seen on
the real cluster, tests/test_real_cluster_kit.py)."""

from __future__ import annotations

import helm_python as helm

from tests.support.manifests import CHART


def test_the_notes_name_the_opt_in_label_and_the_alert() -> None:
    with helm.Chart.load(CHART) as chart:
        out = chart.render({}, name="kde", namespace="gpu-monitoring", is_install=True)
    (notes,) = [text for path, text in out.items() if path.endswith("NOTES.txt")]
    assert "kubectl label node NODE kube-device-exporter.io/enabled=true" in notes
    assert "KubeDeviceExporterNodeNotSelected" in notes
    assert "kubectl -n gpu-monitoring rollout status daemonset/kde-kube-device-exporter" in notes
