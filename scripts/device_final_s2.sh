#!/bin/bash
# Last device call of the second session of 2026-11-23: 3xFP16 time split, the stream test, and the
# cuda backend's bf16 bench of record on the final code.
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
timeout 120 python3 benchmarks/cuda_f16x3_prep.py 2>&1 | grep -v Warning | tee "$OUT/f16x3-prep.log"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_gpu.py -k "inputs_unchanged or f16x3" 2>&1 | tail -2
timeout 200 python3 -m attnhub.cli bench --backends cuda --peers sdpa-flash,sdpa-cudnn --family dense \
  --direction fwd,bwd --lengths 1024,2048,4096,8192,16384 --out "$OUT/cuda-bench" > "$OUT/cuda-bench.log" 2>&1
echo "== bench rc=$?"; grep -E "^dense|^case" "$OUT/cuda-bench.log"
date -u +"end %H:%M:%S UTC"
