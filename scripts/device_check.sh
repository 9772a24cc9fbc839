#!/bin/bash
# One device call: CUDA GPU tests + full certify, Triton full certify (-j) + GPU tests. Logs in $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
step() { local t=$1; shift; local t0=$(date +%s); timeout "$t" "$@" > "$OUT/$LOG.log" 2>&1; echo "== $LOG rc=$? $(( $(date +%s) - t0 ))s"; tail -3 "$OUT/$LOG.log"; }
python3 -m attnhub_backends.cuda.compiler sm_90 > /dev/null 2>&1
LOG=cuda-tests step 120 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_cuda_gpu.py tests/test_peaked_row_gradients.py
LOG=cuda-certify step 90 python3 -m attnhub.cli certify cuda --device cuda --report "$OUT/cuda-gpu-full"
LOG=triton-certify step "${TRITON_CERT_S:-280}" python3 -m attnhub.cli certify triton --device cuda -j 16 --report "$OUT/triton-gpu-full"
grep -E "FAIL|cases:" "$OUT/triton-certify.log" | tail -5
LOG=triton-tests step "${TRITON_TEST_S:-120}" python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py
