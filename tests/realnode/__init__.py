"""The real-node tier's harness: real Kubernetes binaries, Debian's containerd and runc,
images built here, a device plugin of our own, in a private mount namespace.

Modules, each usable on its own (the 1.32 standalone-kubelet tier and the 1.36 cluster
tier share them):
- `binaries`: where the Kubernetes binaries are (environment variables), why a tier skips;
- `namespace`: a private mount namespace that everything of one node runs in;
- `containerd`: a private containerd (its own root, state, socket), image import;
- `images`: the static `pause` and busybox images as docker-archive tars;
- `deviceplugin`: a deviceplugin v1beta1 server over the kubelet's registration socket;
- `kubelet`: KubeletConfiguration, start/stop/restart, waiting on the read-only `/pods`;
- `cleanup`: what a node leaves behind (shims, cgroups, log links), removed by PID/path;
- `pods`: static pod manifests with busybox containers.
The facts they rely on, and why each step is there: docs/real-node.md.
"""
