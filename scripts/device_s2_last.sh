#!/bin/bash
# Last device call of the second session of 2026-11-23: the cuda GPU tests, certify (seed), float32
# bench, and the 3xFP16 time split / small calls on the final code.
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
CERTIFY_SEED=235612467 bash scripts/device_cuda_round.sh tests certify bench32
timeout 120 python3 benchmarks/cuda_f16x3_prep.py 2>&1 | grep -v -i warn | tee "$OUT/f16x3-prep.log"
date -u +"end %H:%M:%S UTC"
