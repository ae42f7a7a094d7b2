#!/usr/bin/env bash
# On a GPU machine, as root: the exporter's own NVML source and attribution resolver in a
# PID namespace of their own (a pod without hostPID), under a CUDA load in the host's.
#  - `unshare --pid --fork`: /proc is still the host's (as the DaemonSet's /host/proc mount);
#  - `unshare --pid --fork --mount-proc`: /proc is the new namespace's (a pod's own /proc).
# Then what reading every process's cgroup and DRM fds costs on this machine.
# Deps: pynvml on PYTHONPATH (.devdeps) or installed; torch for the load.
set -u
export PYTHONPATH=$PWD/.devdeps:$PWD
python3 -c "
import time, torch
a = torch.randn(4096, 4096, device='cuda')
end = time.time() + 30
while time.time() < end: (a @ a).sum().item()
" &
LOAD=$!
sleep 12
PROBE='import os, pathlib, tempfile, time
from exporter.sources import SourceContext
from exporter.sources.nvml import NvmlSource
from exporter.attribution.resolver import ProcessResolver, own_pid_namespace
source = NvmlSource(SourceContext(options={"slow-interval": "1ms", "xid-events": "false"}))
source.collect(); time.sleep(1.5); result = source.collect(); source.close()
procs = [(p.pid, p.memory_bytes, p.utilization) for p in result.processes]
print("  getpid", os.getpid(), "| processes (host pid, memory, utilization):", procs)
print("  own_pid_namespace(/proc):", repr(own_pid_namespace(pathlib.Path("/proc"))) or "usable")
resolver = ProcessResolver(pathlib.Path("/proc"), pathlib.Path(tempfile.mkdtemp()))
print("  resolve:", resolver.resolve([p for p, _, _ in procs]))
for pid, _, _ in procs:
    try:
        print("  cgroup of", pid, open(f"/proc/{pid}/cgroup").read().strip())
    except OSError as exc:
        print("  cgroup of", pid, "unreadable:", exc)'
echo "load host pid: $LOAD"
echo "own PID namespace, host /proc:"; unshare --pid --fork python3 -c "$PROBE"
echo "own PID namespace, own /proc:"; unshare --pid --fork --mount-proc python3 -c "$PROBE"
wait $LOAD
python3 - <<'PY'
import os, pathlib, tempfile, time
from exporter.attribution.resolver import ProcessResolver
from exporter.sources.drmfdinfo import scan
proc = pathlib.Path("/proc")
pids = [int(e) for e in os.listdir(proc) if e.isdigit()]
resolver = ProcessResolver(proc, pathlib.Path(tempfile.mkdtemp()))
t = time.perf_counter(); resolver.resolve(pids); first = time.perf_counter() - t
t = time.perf_counter(); resolver.resolve(pids); cached = time.perf_counter() - t
t = time.perf_counter(); found = scan(proc, ["amdgpu", "i915", "xe"]); drm = time.perf_counter() - t
fds = sum(len(os.listdir(proc / str(p) / "fd")) for p in pids if (proc / str(p) / "fd").exists())
print(f"{len(pids)} processes, {fds} fds: resolve all {first*1e3:.1f} ms first, "
      f"{cached*1e3:.1f} ms cached; DRM fd scan {drm*1e3:.1f} ms ({len(found.clients)} clients)")
PY
