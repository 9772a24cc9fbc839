#!/bin/bash
# Session 4, round 3 (H100): the short-cache decode config (GPU tests, tile sweep at 4k-32k from
# CUDA graphs, decode bench families), transformers tests and the Llama benchmark. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r3
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_cuda_graphs.py \
  tests/test_transformers_gpu.py tests/test_patch_sdpa_llama.py tests/test_host_path_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 200 python3 tools/dev/probe_s4.py --part decodecfg > "$OUT/probe.log" 2>&1; echo "probe rc=$?"
grep -v -i warn "$OUT/probe.log" | head -40
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash --family decode,kvcache,paged,ragged-decode \
  --direction fwd --out /tmp/bench-kv > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench.log" | grep -A12 "^case"
timeout 240 python3 benchmarks/hf_llama.py > "$OUT/hf.log" 2>&1; echo "hf rc=$?"; grep -v -i warn "$OUT/hf.log" | tail -15
