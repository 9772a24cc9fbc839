#!/bin/bash
# The last H100 call of a session: GPU tests of what changed, host overhead, a dense tune grid.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout "${TESTS_S:-180}" python3 -m pytest -q -m gpu -p no:cacheprovider -n 16 tests/test_triton_gpu.py \
  tests/test_sdpa_backends.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.log"
pkill -f "pytest" 2>/dev/null; sleep 2
timeout 60 python3 benchmarks/host_overhead.py > "$OUT/host_overhead.log" 2>&1; echo "host rc=$?"; tail -8 "$OUT/host_overhead.log"
timeout "${TUNE_S:-220}" python3 -m attnhub.cli tune --device cuda --family dense --out "$OUT/profiles" > "$OUT/tune.log" 2>&1
echo "tune rc=$?"; tail -2 "$OUT/tune.log"; ls "$OUT/profiles" 2>/dev/null
