#!/bin/bash
# Session 3, round 2 (H100): the one-launch ragged forward with the vectorised split merge (GPU
# tests, decode host/GPU time, bench families), the padded-mask config, the Llama decode. Logs in $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s3r2
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 240 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_triton_compile.py \
  tests/test_triton_modifiers_gpu.py tests/test_transformers_gpu.py tests/test_cuda_graphs.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 60 python3 tools/dev/probe_s3.py --part kvcache 2>&1 | grep -v -i warn | head -12
timeout 200 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash,flex --family kvcache,paged,ragged-decode,padding \
  --direction fwd,bwd --out /tmp/bench-kv > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench.log" | grep -A30 "^case"
timeout 200 python3 benchmarks/hf_llama.py > "$OUT/llama.log" 2>&1; echo "llama rc=$?"; grep -v -i warn "$OUT/llama.log" | tail -12
