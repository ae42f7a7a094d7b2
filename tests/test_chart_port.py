"""The chart's `service.port` is the exporter's port everywhere: the Service, the container
port the probes name, and the address the exporter listens on (it listened on 9405 whatever
the value, so a changed port failed every probe; found deploying the chart on the real
cluster, tests/test_real_cluster_image.py, where a host-network pod needs a port of its own)."""

from __future__ import annotations

from tests.support.manifests import one, render_chart


def test_a_changed_port_moves_the_listen_address_with_the_container_port() -> None:
    objects = render_chart({"service": {"port": 9500}})
    (container,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [p["containerPort"] for p in container["ports"]] == [9500]
    assert container["startupProbe"]["httpGet"]["port"] == "metrics"
    assert "--web.listen-address=:9500" in container["args"]
    assert one(objects, "Service")["spec"]["ports"][0]["port"] == 9500


def test_the_default_port_adds_no_flag() -> None:
    (container,) = one(render_chart(), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [p["containerPort"] for p in container["ports"]] == [9405]
    assert not any(a.startswith("--web.listen-address") for a in container.get("args", []))
