#!/bin/bash
# Device call after the 3xFP16 D = 128 tile change: GPU tests, certify (seed), float32 bench, time split.
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
CERTIFY_SEED=235612467 bash scripts/device_cuda_round.sh tests certify bench32
timeout 120 python3 benchmarks/cuda_f16x3_prep.py 2>&1 | grep -v -i warn | tee "$OUT/f16x3-prep.log"
date -u +"end %H:%M:%S UTC"
