#!/bin/bash
# Last device call of 2026-11-22: CUDA tests + certify, Triton full certify (-j 16) + GPU tests.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
step() { local t=$1; shift; local t0=$(date +%s); timeout "$t" "$@" > "$OUT/$LOG.log" 2>&1; echo "== $LOG rc=$? $(( $(date +%s) - t0 ))s"; tail -3 "$OUT/$LOG.log"; }
python3 -m attnhub_backends.cuda.compiler sm_90 > /dev/null 2>&1
LOG=cuda-tests step 90 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_cuda_gpu.py tests/test_peaked_row_gradients.py
LOG=cuda-certify step 40 python3 -m attnhub.cli certify cuda --device cuda --report "$OUT/cuda-gpu-full"
LOG=triton-certify step 340 python3 -m attnhub.cli certify triton --device cuda -j 16 --report "$OUT/triton-gpu-full"
grep -E "FAIL|cases:|certified" "$OUT/triton-certify.log" | tail -4
LOG=triton-tests step 85 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py
grep -o "^[.FEsx]\+" "$OUT/triton-tests.log" | tr -d '\n' | wc -c
