#!/bin/bash
# One device call: the decode forward of an older commit (tree in .old46, carried) and of this tree,
# through `attnhub bench`, then benchmarks/triton_decode_probe.py's variants. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
date -u +"start %Y-%m-%d %H:%M:%S UTC"
BENCH="-m attnhub.cli bench --family decode --direction fwd --backends triton --peers sdpa-flash,sdpa-cudnn,sdpa-efficient"
if [ -d .old46 ]; then
  (cd .old46 && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    && timeout 150 python3 $BENCH --out "$OUT/old-decode" > "$OUT/old-decode.log" 2>&1)
  echo "== old rc=$?"; grep -E "^decode|^case" "$OUT/old-decode.log"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 150 python3 $BENCH --out "$OUT/head-decode" > "$OUT/head-decode.log" 2>&1
echo "== head rc=$?"; grep -E "^decode|^case" "$OUT/head-decode.log"
timeout 200 python3 benchmarks/triton_decode_probe.py 2>&1 | tee "$OUT/probe.log"
