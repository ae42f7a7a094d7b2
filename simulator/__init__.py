"""The simulated node: a kubelet, NVML and sysfs devices from one scenario file.

Development tooling, not part of the product: its own distribution (pyproject.toml here) with
its own command, `kde-simulate`, installed editable by `make install`; `make demo`, the tests
and the benchmarks all use it. The exporter never imports it.
"""
