#!/bin/bash
# One device call: triton decode (probe: CPU vs GPU time per call, variants; then `attnhub bench`
# decode), the triton GPU tests, and the cuda backend's `attnhub bench` (fwd, bwd). Results under $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
timeout 150 python3 benchmarks/triton_decode_probe.py > "$OUT/probe.log" 2>&1
grep -E "^Lk|us per call" "$OUT/probe.log"
timeout 120 python3 -m attnhub.cli bench --family decode --direction fwd --backends triton,cuda \
  --peers sdpa-flash,sdpa-cudnn --out "$OUT/decode" > "$OUT/decode.log" 2>&1
echo "== decode bench rc=$?"; grep -E "^decod|^case" "$OUT/decode.log"
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py > "$OUT/triton-tests.log" 2>&1
echo "== triton tests rc=$?"; tail -1 "$OUT/triton-tests.log"; grep -E "^FAILED" "$OUT/triton-tests.log" | head
timeout 200 python3 -m attnhub.cli bench --backends cuda --peers sdpa-flash,sdpa-cudnn --family dense \
  --direction bwd --lengths 4096,8192 --out "$OUT/cuda-bench" > "$OUT/cuda-bench.log" 2>&1
echo "== cuda bench rc=$?"; grep -E "^dense|^case" "$OUT/cuda-bench.log"
date -u +"end %Y-%m-%d %H:%M:%S UTC"
