"""The real-cluster tier: a Kubernetes 1.36 control plane (etcd, kube-apiserver with
`--authorization-mode=Node,RBAC`, kube-scheduler, kube-controller-manager) on loopback, from
binaries named by `KDE_E2E_HYPERKUBE` and `KDE_E2E_ETCD` (docs/testing.md says how they run
here and what they did). It proves what the project's loopback API server
(simulator/apiserver.py) cannot: the kit's RBAC under the real authorizer, ServiceAccount
tokens from the TokenRequest API, and owners made by the real controllers.

binaries.py names the binaries (through tests/realnode/binaries.py); pki.py makes the
certificates with openssl; daemons.py starts and stops processes by PID; controlplane.py
brings the four components up in order and tears them down; api.py is a small REST client
for the tests; rbac.py renders the kit's and the chart's identity and asks the authorizer;
node.py joins a real 1.36 kubelet (tests/realnode's containerd, images and device plugin)
to the cluster; dradriver.py is a DRA driver of the tests' own (plugin registration,
`dra/v1`, `dra-health/v1alpha1`, its ResourceSlice) for that kubelet;
exporter.py runs the exporter and reads its series.
"""
