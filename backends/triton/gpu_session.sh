#!/bin/bash
# Device-machine session for the triton backend: ./backends/triton/gpu_session.sh STEP...
# Steps: test (GPU tests, 8 workers), bench-quick, bench (default grid), certify (full), certify-quick.
# Logs and results go to $OUT (or ./gpu-out); a short summary is printed last.
set -o pipefail
export PYTHONUNBUFFERED=1 ATTNHUB_DISABLE="${ATTNHUB_DISABLE:-}"
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
if python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1; then rm "$OUT/install.log"; else echo "pip install failed (see install.log)"; fi
python3 -c "import attnhub_backends.triton, attnhub; print(attnhub.__file__)" || cat "$OUT/install.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
summary=()
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    test) timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py > "$OUT/test.log" 2>&1; rc=$?
          tail -5 "$OUT/test.log";;
    bench-quick) timeout 400 python3 -m attnhub.cli bench --quick --backends triton --peers sdpa-flash,sdpa-cudnn,flex --out "$OUT" > "$OUT/bench.txt" 2> "$OUT/bench-progress.log"; rc=$?
          cat "$OUT/bench.txt";;
    bench-*) fam="${step#bench-}"; tag="${fam//,/-}"; mkdir -p "$OUT/$tag"; timeout ${BENCH_TIMEOUT:-300} python3 -m attnhub.cli bench --family "$fam" --direction "${DIRS:-fwd,bwd}" --backends triton --peers "${PEERS:-sdpa-flash,sdpa-cudnn,sdpa-efficient,flex}" --out "$OUT/$tag" > "$OUT/$tag/bench.txt" 2>&1; rc=$?
          grep -v "^\[" "$OUT/$tag/bench.txt" | tail -60;;
    certify) timeout 500 python3 -m attnhub.cli certify triton --report "$OUT/certify" > "$OUT/certify.log" 2>&1; rc=$?; tail -40 "$OUT/certify.log";;
    certify-quick) timeout 300 python3 -m attnhub.cli certify triton --quick --report "$OUT/certify-quick" > "$OUT/certify-quick.log" 2>&1; rc=$?; tail -30 "$OUT/certify-quick.log";;
    *) echo "unknown step $step"; rc=2;;
  esac
  summary+=("$step rc=$rc $(( $(date +%s) - t0 ))s")
done
printf '%s\n' "${summary[@]}"
