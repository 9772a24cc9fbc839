#!/bin/bash
# The re-landed compile-latency work on one GPU: the GPU compile tests, first calls in fresh
# processes, and the dense bench (fwd, bwd at L = 4k, 16k against cuDNN). Logs under $OUT.
#   bash tools/dev/tj2_gpu.sh                 (about 4 minutes at most)
#   SEQ=specialised bash tools/dev/tj2_gpu.sh (the dense kernels' Nq/Nk specialised again: both
#                                              FWD_SEQ_ARGS and BWD_SEQ_ARGS emptied on this copy)
#   TUNE=1 ...                                (then `attnhub warmup --tune` for bf16 D=128 and the
#                                              dense bench again, with the recorded picks: +3 min)
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR="${ATTNHUB_CACHE_DIR:-/tmp/attnhub-cache}"
if [ "${SEQ:-}" = specialised ]; then
  sed -i 's/^FWD_SEQ_ARGS = .*/FWD_SEQ_ARGS = []/; s/^BWD_SEQ_ARGS = .*/BWD_SEQ_ARGS = []/' backends/triton/kernels.py
fi
grep -n "^[FB]WD_SEQ_ARGS" backends/triton/kernels.py
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton_compile.py > "$OUT/compile_tests.log" 2>&1
echo "compile tests rc=$?"; tail -5 "$OUT/compile_tests.log"
timeout 50 python3 tools/dev/first_call.py > "$OUT/first_call.log" 2>&1
echo "first_call rc=$?"; cat "$OUT/first_call.log"
bench() {
  timeout 75 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn --family dense \
    --direction fwd,bwd --lengths 4096,16384 --out "/tmp/$1" > "$OUT/$1.log" 2>&1
  echo "bench $1 rc=$?"; tail -12 "$OUT/$1.log"
}
bench bench-dense
if [ "${TUNE:-}" = 1 ]; then
  timeout 120 python3 -m attnhub.cli warmup --tune --dtype bfloat16 --head-dims 128 > "$OUT/warmup_tune.log" 2>&1
  echo "warmup --tune rc=$?"; tail -4 "$OUT/warmup_tune.log"
  bench bench-dense-tuned
fi
