#!/bin/bash
# Session 5, round 3 (H100): GPU tests of the ragged and modifier kernels after the decode split
# policy and softcap tiles; the bias forward per config and TMA setting; decode bench families.
# Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r3
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 100 python3 tools/dev/probe_s5.py --part biascfg --tmas 0,3 \
  --fwd-cfgs "128,128,8,3,0,1;128,64,8,3,0,1;128,64,8,3;64,64,4,3,0,1;64,64,4,3" > "$OUT/biascfg.log" 2>&1; echo "biascfg rc=$?"
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-flash --family kvcache,paged,ragged-decode \
  --direction fwd --out /tmp/bench-kv > "$OUT/benchkv.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/benchkv.log" | grep -A6 "^case"
timeout 240 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_ragged_gpu.py tests/test_triton_modifiers_gpu.py \
  tests/test_cuda_graphs.py tests/test_triton_compile.py tests/test_host_path_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
