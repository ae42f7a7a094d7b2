#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the real-driver test, then the exporter alone at a 1 s
# interval for 60 s: CPU share of a core, RSS, /healthz, and the time SIGTERM takes.
# Writes under $OUT (default ./bench-out). Deps on PYTHONPATH (.devdeps) or installed.
set -u
OUT=${OUT:-bench-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devdeps:$PWD
python3 -m pytest -q -s -p no:cacheprovider tests/test_nvml_real.py -k "not simulated" > $OUT/real.txt 2>&1
python3 -m exporter --collect-interval 1s --web.listen-address 127.0.0.1:9405 --kubelet-socket /nonexistent.sock --node-name gpu-box > $OUT/exporter.log 2>&1 &
PID=$!
sleep 12
T0=$(awk '{print $14+$15}' /proc/$PID/stat); S0=$(date +%s.%N)
sleep 60
T1=$(awk '{print $14+$15}' /proc/$PID/stat); S1=$(date +%s.%N)
RSS=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
python3 - <<PY > $OUT/cpu.txt
tck=$(getconf CLK_TCK)
cpu=($T1-$T0)/tck; wall=$S1-$S0
print(f"cpu_s={cpu:.3f} wall_s={wall:.1f} share_of_core={100*cpu/wall:.3f}% per_cycle_ms={1000*cpu/wall:.2f} rss_kib=$RSS")
PY
curl -s localhost:9405/metrics > $OUT/metrics.txt; curl -s -o /dev/null -w "%{http_code}\n" localhost:9405/healthz >> $OUT/cpu.txt
S=$(date +%s.%N); kill -TERM $PID; wait $PID; E=$(date +%s.%N)
python3 -c "print('sigterm_exit_s', $E-$S)" >> $OUT/cpu.txt
# The figures the docs quote (docs/measured.json), then the docs themselves: MACHINE names the
# GPU, driver and CUDA version, e.g. MACHINE="one H100 80GB HBM3, driver 580.159.04, CUDA 13.0".
[ -n "${MACHINE:-}" ] && python3 -m bench.measured --real-gpu $OUT/cpu.txt --machine "$MACHINE"
cat $OUT/cpu.txt; tail -3 $OUT/real.txt
