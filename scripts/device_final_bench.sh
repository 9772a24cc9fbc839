#!/bin/bash
# Figures of record on the final code, one device call per stage group; results under $OUT.
#   cuda:   GPU tests, `attnhub bench` fwd+bwd (bf16, L = 4k, 8k) and float32 fwd against math SDPA
#   triton: `attnhub bench` dense fwd+bwd (L = 4k-16k) and local+decode (FlexAttention too)
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
B="python3 -m attnhub.cli bench"
for stage in "$@"; do
  case $stage in
  cuda)
    timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_cuda_gpu.py \
      tests/test_peaked_row_gradients.py > "$OUT/cuda-tests.log" 2>&1
    echo "== cuda tests rc=$?"; tail -1 "$OUT/cuda-tests.log"; grep -E "^FAILED" "$OUT/cuda-tests.log" | head
    timeout 200 $B --backends cuda --peers sdpa-flash,sdpa-cudnn --family dense --direction fwd,bwd \
      --lengths 4096,8192 --out "$OUT/cuda-bench" > "$OUT/cuda-bench.log" 2>&1
    echo "== cuda bench rc=$?"; grep -E "^dense|^case" "$OUT/cuda-bench.log"
    timeout 120 $B --backends cuda --peers sdpa-math --dtype float32 --family dense --direction fwd \
      --lengths 4096 --out "$OUT/cuda-f32" > "$OUT/cuda-f32.log" 2>&1
    echo "== cuda f32 rc=$?"; grep -E "^dense|^case" "$OUT/cuda-f32.log" ;;
  triton)
    timeout 330 $B --backends triton --peers sdpa-flash,sdpa-cudnn --family dense --direction fwd,bwd \
      --lengths 4096,8192,16384 --out "$OUT/triton-dense" > "$OUT/triton-dense.log" 2>&1
    echo "== triton dense rc=$?"; grep -E "^dense|^case" "$OUT/triton-dense.log"
    timeout 200 $B --backends triton --peers flex,sdpa-flash,sdpa-cudnn --family local,decode --direction fwd \
      --out "$OUT/triton-local" > "$OUT/triton-local.log" 2>&1
    echo "== triton local/decode rc=$?"; grep -E "^local|^decod|^case" "$OUT/triton-local.log" ;;
  esac
done
date -u +"end %Y-%m-%d %H:%M:%S UTC"
