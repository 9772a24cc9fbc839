#!/bin/bash
# Session 4, round 1 (H100): the SDPA backends' direct-op bound calls (GPU tests, full
# certification, host overhead), and where the decode call's host time goes. Logs under $OUT.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_fast_path.py tests/test_sdpa_backends.py \
  tests/test_cuda_graphs.py tests/test_torch_compile.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
for b in sdpa-flash sdpa-efficient sdpa-cudnn; do
  timeout 150 python3 -m attnhub.cli certify $b --device cuda -j 16 --seed 20261124 --report "$OUT/$b-h100-full" > "$OUT/cert-$b.log" 2>&1
  echo "certify $b rc=$?"; grep -iE "certified|FAIL|cases" "$OUT/cert-$b.log" | tail -3
done
timeout 60 python3 benchmarks/host_overhead.py > "$OUT/host.log" 2>&1; echo "host rc=$?"; grep -v -i warn "$OUT/host.log"
timeout 90 python3 tools/dev/probe_s4.py --part host,kvhost 2>&1 | grep -v -i warn | head -80
