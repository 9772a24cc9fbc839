#!/bin/bash
# Session 5, round 5 (H100): forward bias and mask tiles load whole vectors below Nk (the forward's
# Nk is unspecialised): GPU modifier and mask tests, bias forward per config and TMA setting,
# padding/bias bench families. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r5
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 150 python3 tools/dev/probe_s5.py --part biascfg --tmas 0,3 \
  --fwd-cfgs ";128,64,8,3,0,1;128,64,8,3;64,64,4,3;128,128,8,2" > "$OUT/biascfg.log" 2>&1; echo "biascfg rc=$?"
cat "$OUT/biascfg.log"
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_modifiers_gpu.py tests/test_triton_mask_forms.py \
  tests/test_triton_gpu.py -k "not slow" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 200 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-efficient,flex --family padding,bias \
  --out /tmp/bench-pb > "$OUT/bench_pb.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_pb.log" | grep -A6 "^case"
