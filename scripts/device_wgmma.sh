#!/bin/bash
# One device call for the cuda backend's wgmma kernels: probe (check + timings), then stages of
# device_cuda_round.sh. Usage: bash scripts/device_wgmma.sh "PROBE ARGS" [stages: tests certify bench]
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
PROBE=${1:-"--configs 2,128"}; shift || true
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"; nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$PROBE" != "none" ]; then
  timeout 300 python3 benchmarks/cuda_wgmma_probe.py $PROBE --json "$OUT/wgmma-probe.json" 2>&1 | tee "$OUT/wgmma-probe.log" | grep -v Warning
  echo "== probe rc=${PIPESTATUS[0]}"
fi
[ $# -gt 0 ] && bash scripts/device_cuda_round.sh "$@"
date -u +"end %H:%M:%S UTC"
