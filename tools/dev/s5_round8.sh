#!/bin/bash
# Session 5, round 8 (H100): tiny Hugging Face models through attnhub on the GPU, the Llama
# benchmark, the decode and softcap bench families at this session's last commit. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r8
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_patch_sdpa_llama.py \
  tests/test_transformers_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash --family kvcache,paged,ragged-decode \
  --direction fwd --out /tmp/bench-kv > "$OUT/benchkv.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/benchkv.log" | grep -A6 "^case"
timeout 220 python3 benchmarks/hf_llama.py > "$OUT/hf.log" 2>&1; echo "hf rc=$?"; grep -v -i warn "$OUT/hf.log" | tail -8
