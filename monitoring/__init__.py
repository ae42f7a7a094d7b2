"""The monitoring kit generator: Grafana dashboards and Prometheus alert rules, as code.

Everything here writes files that are committed (`dashboards/*.json`, `deploy/grafana/`,
`deploy/alerts/`, `deploy/prometheus-operator/prometheusrule.yaml`); `python -m monitoring`
regenerates them and `python -m monitoring --check` fails on a difference. Queries are
written with OpenTelemetry metric and attribute names and translated through the spec table
(`exporter/metrics.py`), so no Prometheus name is written by hand.
"""
