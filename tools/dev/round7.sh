#!/bin/bash
# Session round 7 (H100): the GPU tests of everything this session changed, the triton backend's
# quick certification, host time per call with the shipped profile, the two dispatch points that
# read below 0.97x re-timed with more rounds. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-r7
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 300 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py tests/test_triton_modifiers_gpu.py \
  tests/test_triton_ragged_gpu.py tests/test_triton_compile.py tests/test_host_path_gpu.py tests/test_fast_path.py \
  tests/test_sdpa_backends.py tests/test_transformers_gpu.py tests/test_cuda_graphs.py tests/test_torch_compile.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -15
timeout 100 python3 -m attnhub.cli certify triton --quick --device cuda > "$OUT/certify_triton_quick.log" 2>&1
echo "certify triton quick rc=$?"; grep -E "cases|FAIL" "$OUT/certify_triton_quick.log" | tail -3
timeout 45 python3 benchmarks/host_overhead.py > "$OUT/host.log" 2>&1; echo "host rc=$?"; grep -v -i warn "$OUT/host.log"
timeout 60 python3 benchmarks/auto_dispatch.py --only "fwd D=128 L=8192 Full" --rounds 7 > "$OUT/auto_8k.log" 2>&1
echo "auto 8k rc=$?"; grep -v -i warn "$OUT/auto_8k.log"
