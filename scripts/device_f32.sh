#!/bin/bash
# One device call for the cuda backend's float32 forwards: GPU tests of the float32 paths, then
# benchmarks/cuda_f32.py (accuracy against float64, speed against math SDPA). Usage:
#   bash scripts/device_f32.sh "CONFIGS" [pytest -k expression]
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
CONFIGS=${1:-"f16x3:4,64,1 f16x3:4,32,1"}
K=${2:-"float32"}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"; nvidia-smi --query-gpu=name --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null; git status --short | head -20
if [ "$K" != "none" ]; then
  timeout 280 python3 -m pytest -q -m gpu -n 16 tests/test_cuda_gpu.py -k "$K" -p no:cacheprovider 2>&1 | tail -40 | tee "$OUT/f32-tests.log"
fi
timeout 300 python3 benchmarks/cuda_f32.py --configs $CONFIGS 2>&1 | grep -v Warning | tee "$OUT/f32-bench.log"
date -u +"end %H:%M:%S UTC"
