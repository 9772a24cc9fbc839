#!/bin/bash
# Session 3, round 4 (H100): the direct relaunch (GPU tests of every Relauncher user, decode host
# and GPU time, host time per call with triton named, the decode bench families). Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s3r4
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 230 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_cuda_graphs.py \
  tests/test_triton_compile.py tests/test_host_path_gpu.py tests/test_triton_gpu.py -k "not slow" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 60 python3 tools/dev/probe_s3.py --part kvcache 2>&1 | grep -v -i warn | head -7
timeout 45 python3 benchmarks/host_overhead.py --backend triton > "$OUT/host.log" 2>&1; echo "host rc=$?"; grep -v -i warn "$OUT/host.log"
timeout 120 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash --family kvcache,paged \
  --direction fwd --out /tmp/bench-kv > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench.log" | grep -A6 "^case"
