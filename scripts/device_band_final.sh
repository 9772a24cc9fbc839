#!/bin/bash
# Figures of record for the band walk (issue 4), one device call per stage group; results under $OUT.
#   tests:   the Triton GPU tests (every forward candidate pinned, rules x syncs, dtypes, gradients)
#   bench:   `attnhub bench` dense forward (L = 4k-16k) and local + decode forward (FlexAttention too)
#   host:    probe_fwd host (CPU per call, kernel time, do_bench with and without a CUDA graph)
#   local:   `attnhub bench` local + decode forward only
#   dense64: probe_fwd dense64 (D = 64 dense forward, band walk or not, pinned configs)
#   certify: `attnhub certify triton` in full mode, 16 jobs
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
B="python3 -m attnhub.cli bench"
bench_local() {  # local windows and decode, forward, with FlexAttention among the peers
  timeout 160 $B --backends triton --peers flex,sdpa-flash,sdpa-cudnn --family local,decode --direction fwd \
    --out "$OUT/triton-local" > "$OUT/triton-local.log" 2>&1
  echo "== local/decode rc=$?"; grep -E "^local|^decod|^case|TUNED|chosen" "$OUT/triton-local.log"
}
for stage in "$@"; do
  date -u +"== $stage start %H:%M:%S UTC"
  case $stage in
  tests)
    timeout 250 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py > "$OUT/triton-tests.log" 2>&1
    echo "== tests rc=$?"; tail -1 "$OUT/triton-tests.log"; grep -E "^FAILED" "$OUT/triton-tests.log" | head ;;
  bench)
    timeout 160 $B --backends triton --peers sdpa-flash,sdpa-cudnn --family dense --direction fwd \
      --lengths 4096,8192,16384 --out "$OUT/triton-dense-fwd" > "$OUT/triton-dense-fwd.log" 2>&1
    echo "== dense fwd rc=$?"; grep -E "^dense|^case" "$OUT/triton-dense-fwd.log"
    bench_local ;;
  host)
    timeout 120 python3 -m attnhub_backends.triton.probe_fwd host > "$OUT/probe-host.log" 2>&1
    echo "== host rc=$?"; grep -E "^HOST|Error" "$OUT/probe-host.log" ;;
  dense64)
    timeout 150 python3 -m attnhub_backends.triton.probe_fwd dense64 > "$OUT/probe-dense64.log" 2>&1
    echo "== dense64 rc=$?"; sed -n '/SUMMARY/,$p' "$OUT/probe-dense64.log" ;;
  local)
    bench_local ;;
  certify)
    timeout 420 python3 -m attnhub.cli certify triton --device cuda -j 16 --report "$OUT/triton-h100-full.json" \
      > "$OUT/triton-certify.log" 2>&1
    echo "== certify rc=$?"; grep -E "cases|certified|FAIL" "$OUT/triton-certify.log" | tail -5 ;;
  esac
done
date -u +"end %H:%M:%S UTC"
