#!/bin/bash
# Session 4, round 2 (H100): the decode host path (direct C launcher, no lse, cheaper operands):
# GPU tests of the ragged and dense relaunch, host breakdown, decode tile configs from CUDA graphs,
# host overhead, decode bench families. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r2
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_cuda_graphs.py \
  tests/test_triton_compile.py tests/test_host_path_gpu.py tests/test_triton_gpu.py -k "not slow" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 200 python3 tools/dev/probe_s4.py --part kvhost,decodecfg > "$OUT/probe.log" 2>&1; echo "probe rc=$?"
grep -v -i warn "$OUT/probe.log" | grep -v "^ *[0-9]* *0\.0" | head -70
for i in 1 2; do timeout 60 python3 benchmarks/host_overhead.py > "$OUT/host$i.log" 2>&1; echo "host rc=$?"; grep -v -i warn "$OUT/host$i.log"; done
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash --family decode,kvcache,paged,ragged-decode \
  --direction fwd --out /tmp/bench-kv > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench.log" | tail -30
