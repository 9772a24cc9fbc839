#!/bin/bash
# Session 6, round 2 (H100): ragged backward with its address arithmetic hoisted out of the loops;
# tile sweep on the padding and varlen cases, FlexAttention and varlen_attn beside; ragged GPU tests.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r2
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 300 python3 tools/dev/probe_s6.py --part ragbwd > "$OUT/ragbwd.log" 2>&1
echo "ragbwd rc=$?"; grep -v -i warn "$OUT/ragbwd.log"
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_triton_ragged_gpu.py \
  tests/test_transformers_gpu.py tests/test_patch_sdpa_llama.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
