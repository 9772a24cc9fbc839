#!/bin/bash
# One device call for issue 4's sliding-window target: the band walk checked against the float64
# reference, then local (and dense causal) forward timings of band / index-list configs against the
# peers in the same process (probe_fwd). Usage: bash scripts/device_band.sh [steps...]
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
for s in ${@:-checkband band causalband}; do
  t0=$(date +%s)
  timeout 400 python3 -m attnhub_backends.triton.probe_fwd $s > "$OUT/probe-$s.log" 2>&1
  echo "== $s rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "^CHECK|FAIL" "$OUT/probe-$s.log" | head -20
  sed -n '/SUMMARY/,$p' "$OUT/probe-$s.log"
done
date -u +"end %H:%M:%S UTC"
