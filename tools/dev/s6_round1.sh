#!/bin/bash
# Session 6, round 1 (H100): dq added atomically by the dk/dv kernel against the dq kernel, on the
# real-model backward cases and dense grid, over dk/dv tile configs; GPU tests with the atomic path
# forced. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 330 python3 tools/dev/probe_s6.py --part atomic \
  --cfgs "default 128,64,8,2 64,64,4,3 128,128,8,2" > "$OUT/atomic.log" 2>&1
echo "atomic rc=$?"; grep -v -i warn "$OUT/atomic.log"
ATTNHUB_TRITON_ATOMIC_DQ=1 timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_modifiers_gpu.py \
  tests/test_triton_gpu.py tests/test_triton_ragged_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
