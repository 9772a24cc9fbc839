#!/bin/bash
# Nsight Compute sections of the Triton forward on the sliding-window cases (where the time goes:
# pipe utilisation, L2 throughput, occupancy limits, warp stalls). ncu needs --clock-control none
# (METHOD.md). PROBE_NCU="case:cfg;..." picks LOCAL cases and pinned configs (default and format:
# probe_fwd.ncu_calls).
# Usage: bash scripts/device_ncu.sh
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
t0=$(date +%s)
timeout 300 ncu --clock-control none -k regex:fwd_kernel --launch-count 8 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
  --print-details all python3 -m attnhub_backends.triton.probe_fwd ncu > "$OUT/ncu.log" 2>&1
echo "== ncu rc=$? $(( $(date +%s) - t0 ))s"
grep -E "NCU |fwd_kernel \(|Duration|L2 Cache Throughput|Compute \(SM\) Throughput|Pipe (Tensor|Alu|Fma) Cycles|Pipe Xu|Issued Ipc|No Eligible|Registers Per|Block Limit (Reg|Shared)" "$OUT/ncu.log" | head -80
date -u +"end %H:%M:%S UTC"
