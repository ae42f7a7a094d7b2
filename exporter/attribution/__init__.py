"""PID -> container -> pod, read from the node itself (no API server, no hostPID).

- `cgroup.py`: `/proc/<pid>/cgroup` -> pod UID and container ID (pure);
- `containerlogs.py`: the kubelet's `/var/log/containers` names -> pod, namespace,
  container of a container ID (pure parser plus a directory listing);
- `resolver.py`: the host's `/proc` plus the log directory, cached by PID start time;
- `usage.py`: per-process usage -> per (device, container) sums (pure).
"""
