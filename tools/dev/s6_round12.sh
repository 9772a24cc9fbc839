#!/bin/bash
# Session 6, round 12 (H100): softcap forward with the bound as every row's max (no running max,
# no rescaling; bf16/f32, softcap·log2 e <= 60): accuracy and times, the softcap bench family
# against FlexAttention, GPU tests, and a quick triton certification.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r12
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 80 python3 tools/dev/probe_s5.py --part softcap --fwd-cfgs "64,64,4,3" --lengths 4096 > "$OUT/softcap.log" 2>&1
echo "softcap rc=$?"; grep -v -i warn "$OUT/softcap.log" | tail -4
timeout 120 python3 -m attnhub.cli bench --backends triton --peers flex --family softcap --direction fwd \
  --out /tmp/bench-sc > "$OUT/bench_sc.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_sc.log" | grep -A5 "^case"
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_modifiers_gpu.py tests/test_triton_gpu.py \
  tests/test_transformers_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 150 python3 -m attnhub.cli certify triton --quick --device cuda -j 16 --seed 20261124 > "$OUT/cert.log" 2>&1
echo "cert rc=$?"; grep -iE "cases|certified" "$OUT/cert.log" | tail -3
