#!/bin/bash
# Session round 2 (H100): triton config picks by `attnhub warmup --tune` (bf16, D 64/128) and the
# dense bench with those picks; the simulated ring again (a second process: repeatability); the
# ring's GPU tests. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/attnhub-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 150 python3 -m attnhub.cli warmup --tune --dtype bfloat16 --head-dims 64,128 > "$OUT/warmup_tune.log" 2>&1
echo "warmup --tune rc=$?"; tail -3 "$OUT/warmup_tune.log"; cp /tmp/attnhub-cache/triton/tuned.json "$OUT/" 2>/dev/null
timeout 80 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn --family dense \
  --direction fwd,bwd --lengths 4096,16384 --out /tmp/bench-tuned > "$OUT/bench_tuned.log" 2>&1
echo "bench tuned rc=$?"; grep -E "^dense" "$OUT/bench_tuned.log"
unset ATTNHUB_CACHE_DIR
timeout 95 python3 benchmarks/ring_sim.py --backend triton --repeat 10 --worlds 2 4 > "$OUT/ring_sim.log" 2>&1
echo "ring_sim rc=$?"; cat "$OUT/ring_sim.log"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_distributed_gpu.py > "$OUT/ring_tests.log" 2>&1
echo "ring tests rc=$?"; tail -3 "$OUT/ring_tests.log"
