"""The simulated node: a kubelet, NVML and sysfs devices from one scenario file.

Shipped with the package: `make demo`, the tests and the benchmarks all use it.
"""
