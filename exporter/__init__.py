"""kube-device-exporter: which pod uses which device, and how hard.

Data flows one way: sources -> join -> snapshot -> sinks (see docs/architecture.md).
"""

import os

__version__ = "0.1.0"

# gRPC core writes its INFO lines straight to stderr, one "Got goaway" per kubelet restart;
# the exporter logs the kubelet's state changes itself. Set before any grpc import; a
# GRPC_VERBOSITY in the environment still wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
