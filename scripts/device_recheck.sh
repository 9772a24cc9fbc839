#!/bin/bash
# One device call re-measuring the final code: the cuda backend's bf16 bench of record (forward and
# backward, L = 1k-16k), its full certify with a given seed (same cases as an earlier report), and the
# Triton and JAX GPU tests. Usage: bash scripts/device_recheck.sh [seed]
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
SEED=${1:-235612467}
step() { local t=$1; shift; local t0=$(date +%s); timeout "$t" "$@" > "$OUT/$LOG.log" 2>&1; echo "== $LOG rc=$? $(( $(date +%s) - t0 ))s"; tail -3 "$OUT/$LOG.log"; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
LOG=cuda-bench step 200 python3 -m attnhub.cli bench --backends cuda --peers sdpa-flash,sdpa-cudnn --family dense \
  --direction fwd,bwd --lengths 1024,2048,4096,8192,16384 --out "$OUT/cuda-bench"
grep -E "^dense|^case" "$OUT/cuda-bench.log"
LOG=cuda-certify step 60 python3 -m attnhub.cli certify cuda --device cuda --seed "$SEED" --report "$OUT/cuda-gpu-full-seed"
grep -E "cases:|certified" "$OUT/cuda-certify.log" | tail -3
LOG=triton-jax-tests step 260 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_triton_gpu.py tests/test_jax_gpu.py
grep -E "^FAILED|passed|failed" "$OUT/triton-jax-tests.log" | tail -8
date -u +"end %H:%M:%S UTC"
