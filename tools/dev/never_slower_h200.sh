#!/bin/bash
# Issue 37's figures on one GPU: is attnhub ever slower than the SDPA the user already has?
# Run on the device machine from the repository root, the cudnn frontend wheel carried in .whl/:
#
#   bash tools/dev/never_slower_h200.sh PART [REPS]   (one never_slower-PART.tgz of logs in $OUT, else .)
#
# A device call runs at most 10 minutes, so the steps come in parts: 1 (GPU tests, host time and
# where it goes, decode, the padded batch, Llama: about 8 minutes; the tests alone about 4, which
# the 200 s limit of 2026-11-28 cut short), 2 (auto against every
# candidate on the bf16 dense grid, with the shipped profile and with it hidden: REPS interleaved
# calls of each runner per case, default 30), 3 (the cudnn backend's full certification).
# Each step has its own time limit and its own log.
set -u
DEST="${OUT:-.}"
OUT="$(mktemp -d)"  # the device returns at most 8 files: the logs travel as one archive
PART="${1:-1}"
REPS="${2:-30}"
export PYTHONUNBUFFERED=1
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed"
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
step() { local limit=$1 log=$2; shift 2; echo "== $*"; timeout "$limit" "$@" >"$OUT/$log" 2>&1; echo "   rc $? -> $log"; }
if [ "$PART" = 1 ]; then
    step 260 tests.log python3 -m pytest -q -m gpu tests/test_cudnn_backend.py tests/test_first_use_gpu.py tests/test_sdpa_backends.py tests/test_triton_ragged_gpu.py tests/test_triton_ragged.py
    step 40 host.log python3 benchmarks/host_overhead.py --rounds 10
    step 60 host_breakdown.log python3 tools/dev/host_path_breakdown.py --rounds 10
    step 60 decode.log python3 benchmarks/kvcache_decode.py --cases 1x8192,8x8192,64x4096
    step 60 padded.log python3 benchmarks/modifiers.py --cases mask
    step 200 llama.log python3 benchmarks/hf_llama.py
elif [ "$PART" = 2 ]; then
    step 270 auto_shipped.log python3 benchmarks/auto_dispatch.py --dtype bfloat16 --reps "$REPS" --json "$OUT/auto_shipped.json"
    step 270 auto_hidden.log python3 benchmarks/auto_dispatch.py --dtype bfloat16 --reps "$REPS" --hide-shipped --json "$OUT/auto_hidden.json"
else
    step 90 certify.log attnhub certify cudnn --device cuda -j 8 --seed 20261128 --report "$OUT/cudnn-h200-full"
fi
tail -n 3 "$OUT"/*.log
tar -czf "$DEST/never_slower-$PART.tgz" -C "$OUT" .
