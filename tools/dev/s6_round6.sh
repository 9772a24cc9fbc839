#!/bin/bash
# Session 6, round 6 (H100): softcap forward with four operations per score (only each row's max
# capped): accuracy and times (probe_s5 softcap), the softcap bench family against FlexAttention;
# GPU tests of the modifier kernels and of the SDPA backends' direct ops (one _direct_op now).
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r6
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 150 python3 tools/dev/probe_s5.py --part softcap --fwd-cfgs "64,64,4,3,0,1;128,128,8,3,0,1;128,64,8,3,0,1" \
  > "$OUT/softcap.log" 2>&1; echo "softcap rc=$?"; grep -v -i warn "$OUT/softcap.log"
timeout 200 python3 -m attnhub.cli bench --backends triton --peers flex --family softcap --direction fwd,bwd \
  --out /tmp/bench-sc > "$OUT/bench_sc.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_sc.log" | grep -A12 "^case"
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_modifiers_gpu.py tests/test_fast_path.py \
  tests/test_sdpa_backends.py tests/test_host_path_gpu.py tests/test_triton_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
