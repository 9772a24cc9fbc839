#!/bin/bash
# Full `attnhub certify triton` on the device machine. Triton compiles one kernel variant per
# signature, one at a time in a single process, so first the grid's cases run in SHARDS parallel
# processes (filling Triton's on-disk cache; their results are also kept), then the authoritative
# single full run (grid + randomised cases) reuses the cache. Usage: gpu_certify.sh [SEED]
set -o pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT/shards"
SEED="${1:-20261122}"; SHARDS="${SHARDS:-12}"
python3 - "$SHARDS" "$OUT/shards" <<'PY'
import sys
from attnhub.registry import REGISTRY
from attnhub_conformance.cases import full_grid
b = REGISTRY.backends()["triton"]
ids = [c.id for c in full_grid(tuple(b.dtypes), "torch")]
n = int(sys.argv[1])
for i in range(n):
    open(f"{sys.argv[2]}/ids{i}", "w").write("\n".join(ids[i::n]))
print(len(ids), "grid cases in", n, "shards")
PY
t0=$(date +%s)
for i in $(seq 0 $((SHARDS - 1))); do
  args=(); while read -r id; do args+=(--case "$id"); done < "$OUT/shards/ids$i"
  timeout "${SHARD_TIMEOUT:-300}" python3 -m attnhub.cli certify triton --seed "$SEED" "${args[@]}" > "$OUT/shards/log$i" 2>&1 &
done
wait
echo "shards done in $(( $(date +%s) - t0 ))s:"; grep -h "cases:" "$OUT"/shards/log* | sort | uniq -c
tar czf "$OUT/shards.tgz" -C "$OUT" shards && rm -rf "$OUT/shards"
t0=$(date +%s)
timeout "${FULL_TIMEOUT:-300}" python3 -m attnhub.cli certify triton --seed "$SEED" --report "$OUT/certify" > "$OUT/certify.log" 2>&1
echo "full certify rc=$? in $(( $(date +%s) - t0 ))s"
tail -45 "$OUT/certify.log"
