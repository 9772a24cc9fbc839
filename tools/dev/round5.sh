#!/bin/bash
# Session round 5 (H100): auto with the shipped full profile against its candidates on the whole
# dense grid (bf16 and f16, fwd and bwd), then host time per call. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/attnhub-r5
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 45 python3 benchmarks/host_overhead.py > "$OUT/host.log" 2>&1; echo "host rc=$?"; grep -v Warning "$OUT/host.log"
for dt in bfloat16 float16; do
  timeout 240 python3 -m attnhub.cli bench --backends auto,triton --peers sdpa-cudnn,sdpa-flash --dtype $dt \
    --family dense --direction fwd,bwd --out "/tmp/bench-auto-$dt" > "$OUT/bench-auto-$dt.log" 2>&1
  echo "bench $dt rc=$?"; grep -E "^dense|^case" "$OUT/bench-auto-$dt.log" | cut -c1-200
  cp /tmp/bench-auto-$dt/bench.json "$OUT/bench-auto-$dt.json"
done
