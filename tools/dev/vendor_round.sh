#!/bin/bash
# Issue 21 on the device: certify the SDPA vendor backends, tune this device's profile, bench auto.
#   bash tools/dev/vendor_round.sh        (OUT: where logs, reports and the profile go)
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
for b in sdpa-flash sdpa-efficient sdpa-cudnn; do
  timeout 120 python3 -m attnhub.cli certify $b --device cuda -j 16 --seed 20261124 --report "$OUT/$b-h100-full" > "$OUT/certify-$b.log" 2>&1
  echo "$b rc=$? $(grep -E 'cases:' "$OUT/certify-$b.log" | tail -1)"
done
timeout "${TUNE_S:-200}" python3 -m attnhub.cli tune --device cuda --quick --dtype bfloat16,float16 > "$OUT/tune.log" 2>&1
echo "tune rc=$?"; tail -3 "$OUT/tune.log"
mkdir -p "$OUT/profiles"; cp ~/.cache/attnhub/profiles/*.json "$OUT/profiles/" 2>/dev/null; ls "$OUT/profiles"
for dt in bfloat16 float16; do
  timeout "${BENCH_S:-120}" python3 -m attnhub.cli bench --backends auto,triton --peers sdpa-cudnn,sdpa-flash --dtype $dt \
    --family dense --direction fwd,bwd --lengths 4096,16384 --out "$OUT/bench-auto-$dt" > "$OUT/bench-auto-$dt.log" 2>&1
  echo "bench $dt rc=$?"; grep -E "^dense|^case" "$OUT/bench-auto-$dt.log" | cut -c1-200
done
