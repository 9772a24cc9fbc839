#!/bin/bash
# Session 3, final round (H100): triton certified in full after the one-launch ragged forward and
# the mask configs; the dense GPU tests of masks; host time per call. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s3f
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 430 python3 -m attnhub.cli certify triton --device cuda -j 16 --seed 20261124 --report "$OUT/triton-h100-full" > "$OUT/certify.log" 2>&1
echo "certify rc=$?"; grep -E "cases|FAIL|pass" "$OUT/certify.log" | tail -4
timeout 45 python3 benchmarks/host_overhead.py > "$OUT/host.log" 2>&1; echo "host rc=$?"; grep -v -i warn "$OUT/host.log"
timeout 90 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py -k "mask" > "$OUT/tests_mask.log" 2>&1
echo "mask tests rc=$?"; grep -E "passed|failed|FAILED" "$OUT/tests_mask.log" | tail -5
