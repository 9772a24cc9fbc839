#!/bin/bash
# Session 4, round 5 (H100): TMA loads and in-kernel padded rows in the ragged forward: GPU tests,
# ragged forward tile configs, padding and varlen bench families. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r5
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 240 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_triton_modifiers_gpu.py \
  tests/test_patch_sdpa_llama.py tests/test_transformers_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 120 python3 tools/dev/probe_s3.py --part raggedcfg 2>&1 | grep -v -i warn | tail -10
timeout 200 python3 -m attnhub.cli bench --family padding,varlen --direction fwd,bwd --out /tmp/bench-pad > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench.log" | grep -A12 "^case"
