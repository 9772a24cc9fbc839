#!/bin/bash
# Session 5, round 6 (H100): batch-shared bias on (tiles, batch, heads) grids, bias forwards on
# pointer loads: GPU tests of the dense, modifier, mask, ragged kernels; bias and padding bench
# families. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r6
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 60 python3 tools/dev/probe_s5.py --part biascfg --tmas "" --fwd-cfgs "" > "$OUT/biascfg.log" 2>&1; echo "biascfg rc=$?"
cat "$OUT/biascfg.log"
timeout 150 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-efficient,flex --family bias,padding \
  --out /tmp/bench-pb > "$OUT/bench_pb.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_pb.log" | grep -A6 "^case"
timeout 280 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_modifiers_gpu.py tests/test_triton_mask_forms.py \
  tests/test_triton_gpu.py tests/test_triton_ragged_gpu.py tests/test_cuda_graphs.py tests/test_triton_compile.py \
  tests/test_host_path_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
