#!/bin/bash
# Session 4, round 8 (H100): the ragged forward's band walk (fixed): GPU tests, band on/off, padding and
# varlen bench (forward). Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r8
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 240 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_triton_modifiers_gpu.py \
  tests/test_patch_sdpa_llama.py tests/test_transformers_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 120 python3 tools/dev/probe_s4.py --part band 2>&1 | grep -v -i warn | tail -4
for i in 1 2; do
timeout 150 python3 -m attnhub.cli bench --family padding,varlen --direction fwd --out /tmp/bench-pad$i > "$OUT/bench$i.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench$i.log" | grep -A3 "^case"
done
