#!/bin/bash
# Session 3, round 1 (H100): the fused split-KV decode forward (GPU tests, host time, bench), the
# cuDNN pin probe and the padded-mask config sweep. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s3r1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_triton_ragged_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 100 python3 tools/dev/probe_s3.py --part kvcache,cudnn 2>&1 | grep -v -i warn > "$OUT/probe.log"
echo "probe rc=$?"; head -80 "$OUT/probe.log"
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash --family kvcache,paged,ragged-decode \
  --direction fwd --out /tmp/bench-kv > "$OUT/bench_kv.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_kv.log" | tail -20
for cfg in "" "128,64,8,3,0,1" "64,64,4,3,0,1" "128,64,8,3" "128,128,8,3"; do
  ATTNHUB_TRITON_FWD_CFG="$cfg" timeout 60 python3 tools/dev/probe_s3.py --part maskcfg 2>&1 | grep -E "cfg|failed|Error"
done
