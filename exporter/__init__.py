"""kube-device-exporter: which pod uses which device, and how hard.

Data flows one way: sources -> join -> snapshot -> sinks (see docs/architecture.md).
"""

__version__ = "0.1.0"
