#!/bin/bash
# One device call: the cuda tensor-core backward's GPU tests with 4 and 8 warps, the backward sweep
# (fused / split, 4 / 8 warps, against SDPA flash), then the triton decode probe. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
for w in 4 8; do
  ATTNHUB_CUDA_BWD_WARPS=$w timeout 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider \
    tests/test_cuda_gpu.py -k "backward" > "$OUT/bwd-tests-w$w.log" 2>&1
  echo "== tests warps=$w rc=$?"; tail -1 "$OUT/bwd-tests-w$w.log"; grep -E "^FAILED" "$OUT/bwd-tests-w$w.log" | head
done
timeout 200 python3 benchmarks/cuda_sweep.py --no-fwd --json "$OUT/bwd-sweep.json" 2>&1 | grep -E "^bwd|device" | tee "$OUT/bwd-sweep.log"
timeout 150 python3 benchmarks/triton_decode_probe.py --lengths 8192 > "$OUT/probe.log" 2>&1
grep -E "^Lk|us per call|tottime|^ +[0-9]" "$OUT/probe.log" | head -60
