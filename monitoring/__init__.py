"""The monitoring kit generator: Grafana dashboards and Prometheus alert rules, as code.

Everything here writes files that are committed, each stored once (`dashboards/*.json` with
the kustomization that wraps them in ConfigMaps, `deploy/alerts/`,
`deploy/prometheusrule/prometheusrule.yaml`); the Helm chart links to the dashboards and the
rule file instead of copying them. `python -m monitoring` regenerates them and
`python -m monitoring --check` fails on a difference. Queries are written with
OpenTelemetry metric and attribute names and translated through the spec table
(`exporter/metrics.py`), so no Prometheus name is written by hand.
"""
