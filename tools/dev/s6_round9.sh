#!/bin/bash
# Session 6, round 9 (H100): softcap backward with the forward's arithmetic (p = exp2(c - 2 cap r),
# 1 - tanh² = 4r(1 - r)); the FMA-only reciprocal against rcp.approx in both directions; the softcap
# bench family against FlexAttention; GPU tests of the modifier kernels.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r9
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
for v in base newton; do
  timeout 150 python3 tools/dev/probe_s5.py --part softcap --tanh $v --fwd-cfgs "64,64,4,3" > "$OUT/softcap_$v.log" 2>&1
  echo "softcap $v rc=$?"; grep -v -i warn "$OUT/softcap_$v.log" | tail -7
done
timeout 200 python3 -m attnhub.cli bench --backends triton --peers flex --family softcap --direction fwd,bwd \
  --out /tmp/bench-sc > "$OUT/bench_sc.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_sc.log" | grep -A8 "^case"
timeout 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_modifiers_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
