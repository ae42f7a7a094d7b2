#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: what can only be measured there, each step bounded.
#  1. tests/test_nvml_real.py: the NVML source and GPM against the real driver;
#  2. python -m bench.nvml_probe: the driver's answers and the cost of each call, GPM's too;
#  3. python -m bench nvml-calls: collect() against the same C calls replayed bare;
#  4. the exporter alone at a 1 s interval for 60 s, no kubelet: share of a core, RSS,
#     /healthz, and the time SIGTERM takes (cpu.txt, which bench.measured reads);
#  5. with FLOOR=1 (the stand-in built: make fakenvml): on the simulated `dense` node, the
#     exporter against the floor of the same work at 1 s and 30 s (the median of three 60 s
#     windows: at 30 s one holds two cycles), and the per-thread table,
#     on this machine's CPU (a GPU node's CPU, not the 2-core VM of make bench).
# Writes $OUT/gpu-node.md (bench/gpu_node.py: copy it to docs/) and $OUT/raw.tgz, the files
# it was made from (default OUT: ./bench-out). Deps installed or on PYTHONPATH.
set -u
FINAL=${OUT:-bench-out}; OUT=$FINAL/raw; mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
step() { echo "== $(date +%T) $*"; }

step machine
{ nvidia-smi --query-gpu=name,driver_version,mig.mode.current,memory.total --format=csv
  nproc; grep -m1 "model name" /proc/cpuinfo; $PY --version; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

step real-driver tests
timeout 180 $PY -m pytest -q -s -p no:cacheprovider tests/test_nvml_real.py > "$OUT/real.txt" 2>&1
tail -4 "$OUT/real.txt"

step probe
timeout 120 $PY -m bench.nvml_probe > "$OUT/probe.json" 2> "$OUT/probe.err"
tail -2 "$OUT/probe.err"

step nvml-calls
timeout 120 $PY -m bench nvml-calls --cycles 100 > "$OUT/nvml-calls.md" 2>&1
tail -4 "$OUT/nvml-calls.md"

step exporter alone, 1 s, 60 s
$PY -m exporter --collect-interval 1s --web.listen-address 127.0.0.1:9405 \
  --kubelet-socket /nonexistent.sock --node-name gpu-box > "$OUT/exporter.log" 2>&1 &
PID=$!
sleep 12
# The process's CPU clock in nanoseconds (bench/procs.py cpu_seconds), not /proc's 10 ms
# ticks: the exporter alone spends about 16 of them in the window.
cpu() { $PY -c "from bench.procs import cpu_seconds; print(cpu_seconds($PID))"; }
T0=$(cpu); S0=$(date +%s.%N)
sleep 60
T1=$(cpu); S1=$(date +%s.%N)
RSS=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
$PY - <<PY > "$OUT/cpu.txt"
cpu=$T1-$T0; wall=$S1-$S0
print(f"cpu_s={cpu:.3f} wall_s={wall:.1f} share_of_core={100*cpu/wall:.3f}% per_cycle_ms={1000*cpu/wall:.2f} rss_kib=$RSS")
PY
$PY - >> "$OUT/cpu.txt" 2>&1 <<'PY'
import urllib.request
open("bench-metrics.txt", "wb").write(urllib.request.urlopen("http://127.0.0.1:9405/metrics").read())
print(urllib.request.urlopen("http://127.0.0.1:9405/healthz").status)
PY
mv bench-metrics.txt "$OUT/metrics.txt" 2>/dev/null
S=$(date +%s.%N); kill -TERM $PID; wait $PID; E=$(date +%s.%N)
$PY -c "print('sigterm_exit_s', round($E-$S, 3))" >> "$OUT/cpu.txt"
cat "$OUT/cpu.txt"
# The figures the docs quote (docs/measured.json): MACHINE names the GPU, driver and CUDA
# version, e.g. MACHINE="one H100 80GB HBM3, driver 580.159.04, CUDA 13.0".
[ -n "${MACHINE:-}" ] && $PY -m bench.measured --real-gpu "$OUT/cpu.txt" --machine "$MACHINE"

if [ -n "${FLOOR:-}" ]; then
  step "floor ratios on dense (this CPU)"
  timeout 330 $PY -m bench floor-ratios --window 60 --rounds 3 > "$OUT/floor.md" 2>&1
  cat "$OUT/floor.md"
  step "threads on dense at 1 s (this CPU)"
  timeout 150 $PY -m bench threads --window 45 > "$OUT/threads.md" 2>&1
  cat "$OUT/threads.md"
fi
$PY -m bench.gpu_node "$OUT" "$(date -u +%F)" > "$FINAL/gpu-node.md"
tar czf "$FINAL/raw.tgz" -C "$FINAL" raw && rm -r "$OUT"
step done
