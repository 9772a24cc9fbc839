#!/bin/bash
# One device call for the cuda backend's wgmma forward: probe (check + timings of tile configs), then
# stages: tests certify bench (as device_cuda_round.sh). Usage: bash scripts/device_wgmma.sh "CONFIGS" [stages]
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
CONFIGS=${1:-"2,128"}; shift || true
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/cuda_wgmma_probe.py --configs $CONFIGS --json "$OUT/wgmma-probe.json" 2>&1 | tee "$OUT/wgmma-probe.log" | grep -v Warning
echo "== probe rc=${PIPESTATUS[0]}"
[ $# -gt 0 ] && bash scripts/device_cuda_round.sh "$@"
date -u +"end %H:%M:%S UTC"
