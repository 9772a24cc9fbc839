#!/bin/bash
# Session 3, round 3 (H100): padding-shaped masks as lengths (GPU tests, bench), the mask
# backward's configs, the patch_sdpa Llama test. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s3r3
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_modifiers_gpu.py tests/test_patch_sdpa_llama.py \
  tests/test_transformers_gpu.py tests/test_triton_ragged_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-efficient,flex --family padding \
  --direction fwd,bwd --out /tmp/bench-pad > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench.log" | grep -A6 "^case"
for c in "-" "64,64,4,2/-" "128,64,8,2/-" "32,128,4,3/-" "-/128,64,8,2" "-/128,32,4,3"; do
  dk="${c%%/*}"; dq="${c##*/}"; [ "$dk" = "-" ] && dk=""; [ "$dq" = "-" ] && dq=""
  ATTNHUB_TRITON_DKDV_CFG="$dk" ATTNHUB_TRITON_DQ_CFG="$dq" timeout 60 python3 tools/dev/probe_s3.py --part maskcfg 2>&1 | grep -E "cfg|failed"
done
