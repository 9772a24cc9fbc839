#!/bin/bash
# One device call for issue 4's w = 1024 window target: Nsight Compute sections of the window
# kernels (where the time goes), then the Gluon window kernel checked against
# the float64 reference and timed against FlexAttention in one process (probe_fwd).
# Usage: bash scripts/device_poly.sh [ncu] [steps...]
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
steps="$*"
if [[ " $steps " == *" ncu "* ]]; then
  t0=$(date +%s)
  export PROBE_NCU="${PROBE_NCU:-1:64,64,4,3,128,0,1;3:64,64,4,3,0,0,1;1:64,64,4,3,128,0,1,1;3:128,64,8,2,128,0,1}"
  timeout 300 ncu --clock-control none -k regex:fwd_kernel --launch-skip 0 --launch-count 8 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    --print-details all python3 -m attnhub_backends.triton.probe_fwd ncu > "$OUT/ncu.log" 2>&1
  echo "== ncu rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "NCU |fwd_kernel|Duration|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|L2 Hit Rate|Issued Ipc|No Eligible|Stall|ERR|==PROF==" "$OUT/ncu.log" | head -120
  steps="${steps/ncu/}"
fi
for s in ${steps:-checkgluon gluon}; do
  t0=$(date +%s)
  timeout 240 python3 -m attnhub_backends.triton.probe_fwd $s > "$OUT/probe-$s.log" 2>&1
  echo "== $s rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "^CHECK|FAIL" "$OUT/probe-$s.log" | head -20
  sed -n '/SUMMARY/,$p' "$OUT/probe-$s.log" | tail -8
done
date -u +"end %H:%M:%S UTC"
