#!/bin/bash
# Full certify of GPU backends on the device machine, N processes each; reports under $OUT.
# Usage: scripts/device_certify.sh BACKEND[:TIMEOUT_S] ...   (env JOBS, default 12; SEED optional)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
JOBS="${JOBS:-12}"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
for spec in "$@"; do
  name="${spec%%:*}"; limit="${spec#*:}"; [ "$limit" = "$spec" ] && limit=300
  seed=(); [ -n "$SEED" ] && seed=(--seed "$SEED")
  t0=$(date +%s)
  timeout "$limit" python3 -m attnhub.cli certify "$name" --device cuda -j "$JOBS" "${seed[@]}" \
    --report "$OUT/$name-gpu-full" > "$OUT/$name-certify.log" 2>&1
  echo "== certify $name: rc=$? in $(( $(date +%s) - t0 ))s"
  grep -E "cases:|certified|FAIL" "$OUT/$name-certify.log" | tail -8
done
