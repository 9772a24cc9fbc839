#!/bin/bash
# Session 5, round 10 (H100): decode with TMA descriptor loads and (64, 2, 3) tiles by default:
# GPU tests of the ragged kernels, CUDA graphs, compile counts, host path, transformers; the
# decode bench families. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r10
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash --family kvcache,paged,ragged-decode \
  --direction fwd --out /tmp/bench-kv > "$OUT/benchkv.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/benchkv.log" | grep -A6 "^case"
timeout 300 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_cuda_graphs.py \
  tests/test_triton_compile.py tests/test_host_path_gpu.py tests/test_transformers_gpu.py tests/test_patch_sdpa_llama.py \
  tests/test_triton_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
