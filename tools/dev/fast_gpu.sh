#!/bin/bash
# Issue 21 item 4 (branch fast) on one H100, under 240 s: GPU tests of the fast path, host overhead
# of auto and of the vendor path, the host-bound tune classes, and host overhead again with auto
# following them. Run from the repository root: OUT=... bash tools/dev/fast_gpu.sh
# Brings back the logs and cache/profiles/<device>.json: the shipped H100 profile with the
# host-bound classes added (copy it over attnhub/profiles/ to ship them).
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT/cache/profiles"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider -n 16 tests/test_sdpa_backends.py \
  tests/test_fast_path.py tests/test_tune_cli.py tests/test_torch_compile.py tests/test_cuda_graphs.py \
  tests/test_profile_dispatch.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -4 "$OUT/tests.log"
timeout 40 python3 benchmarks/host_overhead.py > "$OUT/host_before.log" 2>&1; echo "host (shipped profile) rc=$?"; cat "$OUT/host_before.log"
timeout 15 python3 benchmarks/host_overhead.py --backend sdpa-flash > "$OUT/host_flash.log" 2>&1; echo "host named sdpa-flash rc=$?"; tail -3 "$OUT/host_flash.log"
# The tune merges into a copy of the shipped profile kept as the user's, so that auto reads it next.
cp attnhub/profiles/*.json "$OUT/cache/profiles/"
ATTNHUB_CACHE_DIR="$OUT/cache" timeout 60 python3 -m attnhub.cli tune --device cuda --family host \
  --dtype bfloat16,float16 --warmup 10 --rep 50 > "$OUT/tune.log" 2>&1
echo "tune rc=$?"; cut -c1-300 "$OUT/tune.log"
ATTNHUB_CACHE_DIR="$OUT/cache" timeout 25 python3 benchmarks/host_overhead.py > "$OUT/host_after.log" 2>&1
echo "host (tuned host classes) rc=$?"; cat "$OUT/host_after.log"
