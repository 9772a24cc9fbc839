#!/bin/bash
# Session 4, round 12 (H100): TMA and (64, 64, 4, 3) tiles at head dim 64 in the ragged forward:
# GPU tests, the Llama benchmark.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r12
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_patch_sdpa_llama.py \
  tests/test_transformers_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 300 python3 benchmarks/hf_llama.py > "$OUT/hf.log" 2>&1; echo "hf rc=$?"; grep -v -i warn "$OUT/hf.log" | tail -6
