#!/usr/bin/env bash
# On a GPU machine, as root: which PIDs does NVML report to a process in its own PID
# namespace (as a DaemonSet pod without hostPID) for a CUDA process in the host's?
# Prints the host PID of the load and what NVML answers inside and outside a new PID ns.
set -u
python3 -c "
import time, torch
a = torch.randn(4096, 4096, device='cuda')
end = time.time() + 25
while time.time() < end: (a @ a).sum().item()
" &
LOAD=$!
sleep 10
QUERY='import pynvml, os
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
procs = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
try:
    util = [(s.pid, s.smUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)]
except pynvml.NVMLError as exc:
    util = str(exc)
print("self", os.getpid(), "running", procs, "utilization", util)'
echo "load host pid: $LOAD"
echo "host ns:   $(python3 -c "$QUERY")"
echo "own pidns: $(unshare --pid --fork --mount-proc python3 -c "$QUERY")"
wait $LOAD
